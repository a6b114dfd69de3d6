// H5Dataset's warnings: what does not stop training but a user should know
// (a chunk layout that is slow for patches; data without checksums).

#include "memtrain/data/h5/h5_dataset.h"
#include "memtrain/util/error.h"

namespace memtrain {

std::string H5Dataset::patch_layout_warning(
    const std::array<int64_t, 3>& patch) const {
  if (info_.kind != SampleKind::kVolumes)
    return "";
  // A chunk of half the patch (at most 32) per axis: a patch then touches
  // at most 3 chunks per axis and reads little beyond itself.
  std::array<int64_t, 3> good;
  for (int i = 0; i < 3; ++i)
    good[i] = std::max<int64_t>(1, std::min<int64_t>(32, patch[i] / 2));
  const std::string chunk_text = std::to_string(good[0]) + "x" +
                                 std::to_string(good[1]) + "x" +
                                 std::to_string(good[2]);
  const std::string fix = detail::concat(
      " Rewrite it with chunks [1, C, cd, ch, cw] smaller than the patch, "
      "e.g. `h5repack -l /volumes:CHUNK=1x",
      info_.sample_shape[0],
      "x",
      chunk_text,
      " -l /masks:CHUNK=1x",
      chunk_text,
      " IN OUT` (or memtrain convert-nifti --chunk ",
      good[0],
      "); see docs/data-format.md.");
  if (info_.chunk_shape.empty()) {
    return "'" + info_.path +
           "' dataset '/volumes' is contiguous (not chunked): a patch read "
           "gathers scattered rows from the whole volume and cannot be "
           "cached." +
           fix;
  }
  for (int i = 0; i < 3; ++i) {
    if (info_.chunk_shape[i + 1] > patch[i]) {
      return detail::concat(
          "'",
          info_.path,
          "' dataset '/volumes' has chunks [",
          info_.chunk_shape[1],
          ",",
          info_.chunk_shape[2],
          ",",
          info_.chunk_shape[3],
          "] larger than the patch [",
          patch[0],
          ",",
          patch[1],
          ",",
          patch[2],
          "]: every patch read reads (and decompresses) whole chunks, "
          "more than the patch.",
          fix);
    }
  }
  return "";
}

std::string H5Dataset::checksum_warning() const {
  if (info_.checksummed)
    return "";
  std::string names;
  for (const std::string& d : info_.unchecksummed)
    names += (names.empty() ? "" : ", ") + d;
  return detail::concat(
      "'",
      info_.path,
      "' cannot be verified: ",
      names,
      " ha",
      info_.unchecksummed.size() == 1 ? "s" : "ve",
      " no Fletcher32 checksum (written by another tool), so damaged bytes "
      "would train as data; `memtrain inspect --verify ",
      info_.path,
      "` says more");
}

}  // namespace memtrain
