// Pair files (docs/data-format.md, Pairs): /features_b or /tokens, tower b's
// input, and the optional /pair_ids. The sample dataset (/features_a or
// /images) has been opened and checked by H5Dataset::open like /features or
// /images.
#include <algorithm>

#include "data/h5/h5_dataset_impl.h"
#include "data/h5/h5_read.h"
#include "data/h5/layout.h"
#include "memtrain/util/error.h"

namespace memtrain {

namespace {

// /tokens: integer ids in [0, 2^24) (read as float32, exactly), below the
// dataset's vocab_size attribute when it has one; scanned once, in blocks
// of rows, so that a bad id fails on open, not as an out-of-range
// embedding lookup mid-epoch.
void check_tokens(hid_t ds, DatasetInfo& info, const std::string& tw) {
  MT_CHECK(
      h5::is_integer(ds),
      tw,
      ": expected integer token ids (memtrain convert-captions writes "
      "int32), found ",
      h5::type_name(ds));
  int64_t vocab = 0;
  if (h5::read_attr(ds, layout::kVocabSize, &vocab)) {
    MT_CHECK(
        vocab > 0 && vocab <= (int64_t{1} << 24),
        tw,
        ": attribute vocab_size=",
        vocab,
        " is not in [1, 2^24]");
    info.token_vocab = vocab;
  }
  const int64_t n = info.num_samples;
  const int64_t len = info.context_features;
  const int64_t block = std::max<int64_t>(1, (int64_t{1} << 22) / len);
  std::vector<int64_t> buf;
  std::vector<int64_t> rows;
  int64_t hi = 0;
  for (int64_t r0 = 0; r0 < n; r0 += block) {
    const int64_t m = std::min(block, n - r0);
    rows.resize(m);
    for (int64_t i = 0; i < m; ++i)
      rows[i] = r0 + i;
    buf.resize(m * len);
    h5::read_rows(ds, rows, H5T_NATIVE_INT64, buf.data());
    const auto [lo_it, hi_it] = std::minmax_element(buf.begin(), buf.end());
    const auto at = [&](std::vector<int64_t>::const_iterator it) {
      const int64_t k = it - buf.cbegin();
      return "row " + std::to_string(r0 + k / len) + ", position " +
             std::to_string(k % len);
    };
    MT_CHECK(*lo_it >= 0, tw, ": token id ", *lo_it, " at ", at(lo_it));
    const int64_t limit = vocab > 0 ? vocab : int64_t{1} << 24;
    MT_CHECK(
        *hi_it<limit, tw, ": token id ", *hi_it, " at ", at(hi_it), vocab> 0
            ? " is not below the dataset's vocab_size "
            : " is not below 2^24 = ",
        limit);
    hi = std::max(hi, *hi_it);
  }
  info.token_max = hi;
}

}  // namespace

void H5Dataset::open_pairs(
    Impl& impl, DatasetInfo& info, const std::string& where) {
  const hid_t f = impl.file.get();
  MT_CHECK(
      !h5::has_link(f, layout::kLabels) &&
          !h5::has_link(f, layout::kContextFeatures),
      where,
      ": a pair file (it has /features_b) has no /labels or "
      "/context_features; pairs are matched by row, or by /pair_ids "
      "(docs/data-format.md, Pairs)");
  info.tokens = h5::has_link(f, layout::kTokens);
  MT_CHECK(
      !info.tokens || !h5::has_link(f, layout::kFeaturesB),
      where,
      ": has /features_b and /tokens; tower b reads one of them "
      "(docs/data-format.md, Pairs)");
  h5::Handle dapl = h5::plist(H5Pcreate(H5P_DATASET_ACCESS));
  H5Pset_chunk_cache(dapl.get(), 12421, 64u << 20, 1.0);
  info.context_features = open_row_table(
      impl.context,
      f,
      info.tokens ? layout::kTokens : layout::kFeaturesB,
      where,
      info,
      info.tokens ? "L" : "Fb",
      "row i of both is pair i, so they must be equal",
      dapl.get(),
      /*integers=*/info.tokens);
  info.num_classes = 0;
  if (info.tokens)
    check_tokens(impl.context.get(), info, where + " dataset '/tokens'");

  if (!h5::has_link(f, layout::kPairIds))
    return;  // each row is its own pair: read() gives the row index
  const std::string pw = where + " dataset '/pair_ids'";
  impl.labels = h5::dataset(H5Dopen2(f, layout::kPairIds, H5P_DEFAULT));
  MT_CHECK(impl.labels.valid(), pw, ": cannot open: ", h5::last_error());
  h5::check_declared_size(impl.labels.get(), pw);
  h5::check_fits_memory(impl.labels.get(), pw);
  const auto pdims = h5::dims_of(impl.labels.get());
  MT_CHECK(
      pdims.size() == 1 && static_cast<int64_t>(pdims[0]) == info.num_samples,
      pw,
      ": expected 1-D [N] with N = ",
      info.num_samples,
      " (one id per row)");
  MT_CHECK(
      h5::is_integer(impl.labels.get()),
      pw,
      ": expected integer ids, found ",
      h5::type_name(impl.labels.get()));
  std::vector<int64_t> ids(info.num_samples);
  h5::read_all(impl.labels.get(), H5T_NATIVE_INT64, ids.data());
  const auto lo = std::min_element(ids.begin(), ids.end());
  MT_CHECK(
      *lo >= 0,
      pw,
      ": id ",
      *lo,
      " at row ",
      lo - ids.begin(),
      " is negative; ids are >= 0");
  info.row_labels = std::move(ids);
}

}  // namespace memtrain
