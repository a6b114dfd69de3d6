#pragma once
// Private: H5Dataset::open's check of /volume_ids and /voxel_index (rows
// that belong to volumes, docs/data-format.md), kept apart from h5_dataset.cpp.

#include <string>

#include "data/h5/h5_util.h"

namespace memtrain {

struct DatasetInfo;

// When the open file `file` has /volume_ids or /voxel_index: checks both
// against info.num_samples rows (both present, [N] and [N, 3] integers,
// no negative value, no (volume, voxel) position twice, a grid of at most
// 2^31 positions per volume) and reads them into `info`
// (has_volume_rows, row_volume_ids, row_voxel_index); a dataset without a
// checksum is added to info.unchecksummed. Throws memtrain::Error naming
// `where`, the dataset and what was expected.
void open_volume_rows(hid_t file, DatasetInfo& info, const std::string& where);

}  // namespace memtrain
