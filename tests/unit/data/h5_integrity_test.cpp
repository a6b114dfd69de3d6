// Checksummed data (Note [Checksummed data] in ARCHITECTURE.md): every
// dataset memtrain writes has HDF5's Fletcher32 filter; a read of a damaged
// chunk fails naming the file, the dataset and the rows or patch; `inspect
// --verify` lists exactly the damaged chunks.

#include <gtest/gtest.h>
#include <hdf5.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "memtrain/data/h5/h5_dataset.h"
#include "memtrain/data/h5/inspect.h"
#include "memtrain/data/synthetic/synthetic.h"
#include "memtrain/util/error.h"
#include "test_support.h"

namespace memtrain {
namespace {

struct ChunkAt {
  std::vector<hsize_t> offset;  // in elements
  haddr_t addr = 0;             // in the file
  hsize_t size = 0;             // bytes stored
};

ChunkAt chunk_at(const std::string& path, const char* name, hsize_t index) {
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  const hid_t ds = H5Dopen2(f, name, H5P_DEFAULT);
  const hid_t space = H5Dget_space(ds);
  ChunkAt c;
  c.offset.resize(H5Sget_simple_extent_ndims(space));
  unsigned mask = 0;
  EXPECT_GE(
      H5Dget_chunk_info(
          ds, space, index, c.offset.data(), &mask, &c.addr, &c.size),
      0);
  H5Sclose(space);
  H5Dclose(ds);
  H5Fclose(f);
  return c;
}

// Overwrites up to 512 bytes in the middle of chunk `index` of `name`, on
// disk.
ChunkAt damage(const std::string& path, const char* name, hsize_t index) {
  const ChunkAt c = chunk_at(path, name, index);
  const hsize_t n = std::min<hsize_t>(512, c.size / 2);
  EXPECT_GT(n, 0u);
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(c.addr + c.size / 2 - n / 2));
  std::string junk(n, '\0');
  for (size_t i = 0; i < junk.size(); ++i)
    junk[i] = static_cast<char>((i * 131 + 7) & 0xff);
  f.write(junk.data(), static_cast<std::streamsize>(junk.size()));
  return c;
}

bool has_fletcher32(const std::string& path, const char* name) {
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  const hid_t ds = H5Dopen2(f, name, H5P_DEFAULT);
  const hid_t dcpl = H5Dget_create_plist(ds);
  const bool chunked = H5Pget_layout(dcpl) == H5D_CHUNKED;
  const bool flet = H5Pget_filter_by_id2(
                        dcpl,
                        H5Z_FILTER_FLETCHER32,
                        nullptr,
                        nullptr,
                        nullptr,
                        0,
                        nullptr,
                        nullptr) >= 0;
  H5Pclose(dcpl);
  H5Dclose(ds);
  H5Fclose(f);
  return chunked && flet;
}

using test::error_of;

SyntheticSpec features_spec() {  // 2048 x 64 float32: 2 chunks of 1024 rows
  SyntheticSpec s;
  s.samples = 2048;
  s.features = 64;
  return s;
}

SyntheticSpec volumes_spec() {  // 2 x [1, 16, 16, 16], chunks of 8^3
  SyntheticSpec s;
  s.kind = "volumes";
  s.samples = 2;
  s.channels = 1;
  s.depth = s.height = s.width = 16;
  s.chunk = 8;
  s.classes = 3;
  return s;
}

TEST(H5Integrity, EveryWrittenDatasetHasFletcher32) {
  test::TempDir dir("integrity");
  SyntheticSpec f = features_spec();
  f.context = 5;
  make_synthetic(f, dir.file("f.h5"));
  SyntheticSpec im;
  im.kind = "images";
  im.samples = 8;
  im.dtype = "uint8";
  make_synthetic(im, dir.file("i.h5"));
  SyntheticSpec v = volumes_spec();
  make_synthetic(v, dir.file("v.h5"));
  v.chunk = 0;  // one chunk a volume
  v.dtype = "int16";
  make_synthetic(v, dir.file("v0.h5"));
  for (const auto& [file, name] :
       std::vector<std::pair<std::string, const char*>>{
           {"f.h5", "features"},
           {"f.h5", "context_features"},
           {"f.h5", "labels"},
           {"i.h5", "images"},
           {"i.h5", "labels"},
           {"v.h5", "volumes"},
           {"v.h5", "masks"},
           {"v0.h5", "volumes"},
           {"v0.h5", "masks"}}) {
    EXPECT_TRUE(has_fletcher32(dir.file(file), name)) << file << " " << name;
  }
  for (const char* file : {"f.h5", "i.h5", "v.h5", "v0.h5"}) {
    const H5Dataset ds = H5Dataset::open(dir.file(file), "t");
    EXPECT_TRUE(ds.info().checksummed) << file;
    EXPECT_EQ(ds.checksum_warning(), "");
  }
  // A file from another tool (contiguous, no filter): trains, but says so.
  test::write_raw_h5(dir.file("raw.h5"), {{64, 4}, {}, {64}});
  const H5Dataset raw = H5Dataset::open(dir.file("raw.h5"), "t");
  EXPECT_FALSE(raw.info().checksummed);
  EXPECT_EQ(
      raw.info().unchecksummed,
      (std::vector<std::string>{"/features", "/labels"}));
  EXPECT_EQ(
      raw.checksum_warning(),
      "'" + dir.file("raw.h5") +
          "' cannot be verified: /features, /labels have no Fletcher32 "
          "checksum (written by another tool), so damaged bytes would train "
          "as data; `memtrain inspect --verify " +
          dir.file("raw.h5") + "` says more");
}

TEST(H5Integrity, DamagedRowsFailNamingFileDatasetAndRows) {
  test::TempDir dir("integrity");
  const std::string path = dir.file("f.h5");
  make_synthetic(features_spec(), path);
  std::vector<float> before(64 * 64);
  std::vector<int64_t> y(64);
  std::vector<int64_t> first(64);
  for (int i = 0; i < 64; ++i)
    first[i] = i;
  H5Dataset::open(path, "t").read(first, before.data(), y.data());

  const ChunkAt c = damage(path, "features", 1);
  ASSERT_EQ(c.offset, (std::vector<hsize_t>{1024, 0}));
  const H5Dataset ds = H5Dataset::open(path, "t");  // labels are intact
  std::vector<float> x(3 * 64);
  std::string stderr_text;
  std::string msg;
  // On a thread of its own, as the prefetcher reads: HDF5 prints nothing.
  std::thread reader([&] {
    testing::internal::CaptureStderr();
    msg = error_of([&] { ds.read({5, 1500, 1501}, x.data(), y.data()); });
    stderr_text = testing::internal::GetCapturedStderr();
  });
  reader.join();
  EXPECT_EQ(stderr_text, "");
  EXPECT_EQ(
      msg,
      "'" + path +
          "' dataset '/features' rows 5, 1500-1501: the file is damaged "
          "(checksum mismatch: a chunk's bytes are not the bytes written). "
          "Re-create it (memtrain make-data / convert-nifti) or restore it "
          "from a copy; `memtrain inspect --verify " +
          path + "` lists the damaged chunks");
  // Rows of the intact chunk still read, unchanged.
  std::vector<float> after(64 * 64);
  ds.read(first, after.data(), y.data());
  EXPECT_EQ(after, before);
}

TEST(H5Integrity, DamagedPatchFailsNamingVolumeAndPatch) {
  test::TempDir dir("integrity");
  const std::string path = dir.file("v.h5");
  make_synthetic(volumes_spec(), path);
  // Chunk 13 of /volumes: volume 1 (8 chunks a volume), at [8, 0, 8].
  const ChunkAt c = damage(path, "volumes", 13);
  ASSERT_EQ(c.offset, (std::vector<hsize_t>{1, 0, 8, 0, 8}));
  const H5Dataset ds = H5Dataset::open(path, "t");
  std::vector<float> x(16 * 16 * 16);
  std::vector<int64_t> y(16 * 16 * 16);
  EXPECT_EQ(
      error_of([&] {
        ds.read_patch(1, {4, 0, 4}, {8, 8, 8}, x.data(), y.data());
      }),
      "'" + path +
          "' dataset '/volumes' volume 1, patch at [4, 0, 4] of [8, 8, 8] "
          "voxels: the file is damaged (checksum mismatch: a chunk's bytes "
          "are not the bytes written). Re-create it (memtrain make-data / "
          "convert-nifti) or restore it from a copy; `memtrain inspect "
          "--verify " +
          path + "` lists the damaged chunks");
  // The whole volume (validation reads) fails too; other patches read.
  const std::string whole = error_of([&] { ds.read({1}, x.data(), y.data()); });
  EXPECT_NE(
      whole.find("dataset '/volumes' volumes 1: the file is damaged"),
      std::string::npos)
      << whole;
  EXPECT_EQ(
      error_of([&] {
        ds.read_patch(1, {0, 8, 0}, {8, 8, 16}, x.data(), y.data());
      }),
      "");
  EXPECT_EQ(error_of([&] { ds.read({0}, x.data(), y.data()); }), "");
}

TEST(H5Integrity, VerifyListsExactlyTheDamagedChunks) {
  test::TempDir dir("integrity");
  const std::string path = dir.file("f.h5");
  make_synthetic(features_spec(), path);
  VerifyReport r = verify_file(path);
  EXPECT_EQ(r.exit_status(), 0);
  EXPECT_EQ(r.text, "all 3 chunks of 2 datasets verified\n");

  const ChunkAt c = damage(path, "features", 1);
  r = verify_file(path);
  EXPECT_EQ(r.exit_status(), 2);
  EXPECT_EQ(r.chunks, 3);
  ASSERT_EQ(r.damaged.size(), 1u);
  EXPECT_EQ(
      r.damaged[0],
      "'/features' chunk 1 of 2 at [1024, 0] (rows 1024-2047; " +
          std::to_string(c.size) + " bytes at file offset " +
          std::to_string(c.addr) + "): checksum mismatch");
  EXPECT_NE(r.text.find("1 of 3 chunks damaged"), std::string::npos) << r.text;

  const std::string vpath = dir.file("v.h5");
  make_synthetic(volumes_spec(), vpath);
  damage(vpath, "masks", 6);
  r = verify_file(vpath);
  EXPECT_EQ(r.exit_status(), 2);
  ASSERT_EQ(r.damaged.size(), 1u);
  EXPECT_NE(
      r.damaged[0].find(
          "'/masks' chunk 6 of 16 at [0, 8, 8, 0] (volume 0, voxels [8-15, "
          "8-15, 0-7];"),
      std::string::npos)
      << r.damaged[0];
  // Opening it for training reads the masks: it fails naming the volume.
  const std::string open = error_of([&] { H5Dataset::open(vpath, "t"); });
  EXPECT_NE(
      open.find("dataset '/masks' volume 0, patch at [0, 0, 0] of [16, 16, "
                "16] voxels: the file is damaged"),
      std::string::npos)
      << open;

  test::write_raw_h5(dir.file("raw.h5"), {{64, 4}, {}, {64}});
  r = verify_file(dir.file("raw.h5"));
  EXPECT_EQ(r.exit_status(), 1);
  EXPECT_EQ(r.chunks, 0);
  EXPECT_EQ(
      r.unchecksummed, (std::vector<std::string>{"/features", "/labels"}));
  EXPECT_NE(
      r.text.find("cannot be verified: /features, /labels (no Fletcher32"),
      std::string::npos)
      << r.text;
  EXPECT_EQ(verify_file(dir.file("missing.h5")).exit_status(), 2);
}

}  // namespace
}  // namespace memtrain
