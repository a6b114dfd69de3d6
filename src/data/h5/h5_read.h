#pragma once
// Private: H5Dataset's reads (rows, boxes, whole datasets), and the one home
// of the message a failed read gets: the file, the dataset, what was read
// and, when a chunk's Fletcher32 checksum does not match, that the file is
// damaged and what to do (Note [Checksummed data] in ARCHITECTURE.md).

#include <cstdint>
#include <string>
#include <vector>

#include "data/h5/h5_util.h"

namespace memtrain::h5 {

// True when HDF5's current error stack says a checksum did not match.
bool checksum_failed();

// "rows 3, 5-9" / "volumes 2-3": `rows` ascending and distinct; `noun` is
// "rows" or "volumes". Long lists end in "... (N in all)".
std::string rows_text(const std::vector<int64_t>& rows, const char* noun);

// Whole rows `rows` (ascending, distinct) of dataset `ds` as one hyperslab
// union, read as `mem_type` into `buf` (rows.size() * row elements). `noun`
// names a row in messages ("rows", or "volumes" for /volumes and /masks).
void read_rows(
    hid_t ds,
    const std::vector<int64_t>& rows,
    hid_t mem_type,
    void* buf,
    const char* noun = "rows");

// The box [start, start + count) of the volume dataset `ds` ([N, (C,) D, H,
// W]), read as `mem_type`; messages name volume start[0] and the box's last
// three axes as the patch.
void read_box(
    hid_t ds,
    const std::vector<hsize_t>& start,
    const std::vector<hsize_t>& count,
    hid_t mem_type,
    void* buf);

// The whole dataset, read as `mem_type`.
void read_all(hid_t ds, hid_t mem_type, void* buf);

}  // namespace memtrain::h5
