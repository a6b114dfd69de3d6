// Pair files (data/FORMAT.md, Pairs): /features_b, tower b's input, and the
// optional /pair_ids. The sample dataset (/features_a or /images) has been
// opened and checked by H5Dataset::open like /features or /images.
#include <algorithm>

#include "h5_dataset_impl.h"
#include "h5_read.h"
#include "memtrain/util/error.h"

namespace memtrain {

void H5Dataset::open_pairs(
    Impl& impl, DatasetInfo& info, const std::string& where) {
  const hid_t f = impl.file.get();
  MT_CHECK(
      !h5::has_link(f, "labels") && !h5::has_link(f, "context_features"),
      where,
      ": a pair file (it has /features_b) has no /labels or "
      "/context_features; pairs are matched by row, or by /pair_ids "
      "(data/FORMAT.md, Pairs)");
  h5::Handle dapl = h5::plist(H5Pcreate(H5P_DATASET_ACCESS));
  H5Pset_chunk_cache(dapl.get(), 12421, 64u << 20, 1.0);
  info.context_features = open_row_table(
      impl.context,
      f,
      "features_b",
      where,
      info,
      "Fb",
      "row i of both is pair i, so they must be equal",
      dapl.get());
  info.num_classes = 0;

  if (!h5::has_link(f, "pair_ids"))
    return;  // each row is its own pair: read() gives the row index
  const std::string pw = where + " dataset '/pair_ids'";
  impl.labels = h5::dataset(H5Dopen2(f, "pair_ids", H5P_DEFAULT));
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
