// Bad files and bad disks (issue 35): a dataset whose declared size the
// file cannot hold is refused before anything is allocated from it; a
// truncated file's refusal carries HDF5's own reason and points at
// `inspect --verify`; the temporary files of a killed writer are removed
// by the next writer of the folder, a live process's never; a writer that
// throws leaves no descriptor and no temporary file.
// (A full disk is tested end to end, in a private mount namespace:
// tests/e2e/full_disk.sh; here predict's output and convert-images'
// appended rows.)

#include <gtest/gtest.h>
#include <hdf5.h>
#include <nifti/nifti1.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "memtrain/convert/image_convert.h"
#include "memtrain/data/h5/inspect.h"
#include "memtrain/data/synthetic/synthetic.h"
#include "memtrain/formats/nifti/nifti_volume.h"
#include "memtrain/util/atomic_file.h"
#include "memtrain/util/error.h"
#include "memtrain/util/png.h"
#include "memtrain/util/temp_path.h"
#include "test_support.h"

namespace memtrain {
namespace {

namespace fs = std::filesystem;

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A file declaring /features [rows, 16] float32 and /labels [rows] int64,
// neither ever written (HDF5 allocates their storage late: the file is a
// few KB), contiguous or in chunks.
void write_declared(const std::string& path, hsize_t rows, bool chunked) {
  const hid_t f =
      H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  auto make = [&](const char* name, std::vector<hsize_t> dims, hid_t type) {
    const hid_t sp =
        H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
    const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    if (chunked) {
      std::vector<hsize_t> chunk(dims);
      chunk[0] = 1024;
      H5Pset_chunk(dcpl, static_cast<int>(chunk.size()), chunk.data());
    }
    const hid_t ds =
        H5Dcreate2(f, name, type, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    ASSERT_GE(ds, 0);
    H5Dclose(ds);
    H5Pclose(dcpl);
    H5Sclose(sp);
  };
  make("features", {rows, 16}, H5T_IEEE_F32LE);
  make("labels", {rows}, H5T_STD_I64LE);
  H5Fclose(f);
}

TEST(DeclaredSize, NeverWrittenContiguousDatasetIsRefusedByName) {
  test::TempDir dir("declared");
  const std::string path = dir.file("huge.h5");
  write_declared(path, hsize_t{1} << 36, /*chunked=*/false);
  ASSERT_LT(fs::file_size(path), 100000u);
  const std::string e = test::open_error(path);
  EXPECT_TRUE(has(e, "'" + path + "' dataset '/features'")) << e;
  EXPECT_TRUE(has(e, "declares [68719476736,16] float32")) << e;
  EXPECT_TRUE(has(e, "4398046511104 bytes (4.0 TiB)")) << e;
  EXPECT_TRUE(has(e, "the whole file holds only")) << e;
  EXPECT_TRUE(has(e, "never written")) << e;
  // inspect says the same, as its problem, instead of std::bad_alloc.
  const InspectReport r = inspect_file(path);
  EXPECT_FALSE(r.ok);
  EXPECT_TRUE(has(r.text, "never written")) << r.text;
}

TEST(DeclaredSize, NeverWrittenChunkedDatasetIsRefused) {
  test::TempDir dir("declared");
  const std::string path = dir.file("huge.h5");
  write_declared(path, hsize_t{1} << 36, /*chunked=*/true);
  const std::string e = test::open_error(path);
  EXPECT_TRUE(has(e, "dataset '/features': declares [68719476736,16]")) << e;
  EXPECT_TRUE(has(e, "(0 stored for this dataset)")) << e;
}

TEST(DeclaredSize, SmallUnwrittenChunkedDatasetsAreLeftToTheReaders) {
  // Chunks never written read as zeros: a file of cases of different
  // shapes stores only the chunks inside each case. Below 1 GiB declared,
  // nothing is refused for that.
  test::TempDir dir("declared");
  const std::string path = dir.file("sparse.h5");
  write_declared(path, 4096, /*chunked=*/true);
  const std::string e = test::open_error(path);
  EXPECT_FALSE(has(e, "declares")) << e;
}

TEST(TruncatedFile, RefusalCarriesHdf5sReasonAndPointsAtVerify) {
  test::TempDir dir("truncated");
  const std::string path = dir.file("cut.h5");
  SyntheticSpec spec;
  spec.samples = 512;
  make_synthetic(spec, path);
  const auto size = fs::file_size(path);
  fs::resize_file(path, size / 2);
  const std::string e = test::open_error(path);
  EXPECT_TRUE(has(e, "data.train: '" + path + "': cannot open: ")) << e;
  EXPECT_TRUE(has(e, "truncated file: eof = " + std::to_string(size / 2))) << e;
  EXPECT_TRUE(has(e, "memtrain inspect --verify " + path)) << e;
  // --verify itself gives the reason without sending the user back to it.
  const VerifyReport v = verify_file(path);
  EXPECT_EQ(v.exit_status(), 2);
  EXPECT_TRUE(has(v.text, "truncated file: eof = ")) << v.text;
  EXPECT_FALSE(has(v.text, "--verify")) << v.text;
}

TEST(TruncatedFile, TextIsStillNotAnHdf5File) {
  test::TempDir dir("truncated");
  const std::string path = dir.file("text.h5");
  std::ofstream(path) << "this is not HDF5\n";
  EXPECT_TRUE(has(test::open_error(path), "not an HDF5 file"));
}

// A process id that no process has: a child that has exited and been
// reaped.
pid_t dead_pid() {
  const pid_t pid = ::fork();
  if (pid == 0)
    ::_exit(0);
  ::waitpid(pid, nullptr, 0);
  return pid;
}

// A file last written `age` seconds ago.
void touch(const std::string& path, int age = 3600) {
  std::ofstream(path) << "partial";
  const auto when =
      fs::file_time_type::clock::now() - std::chrono::seconds(age);
  fs::last_write_time(path, when);
}

TEST(StaleTempFiles, DeadWritersFilesAreRemovedAndSaid) {
  test::TempDir dir("stale");
  const pid_t dead = dead_pid();
  // A live process other than this one: a child that waits.
  const pid_t live = ::fork();
  if (live == 0) {
    ::pause();
    ::_exit(0);
  }
  const std::string stale =
      dir.file("ckpt.safetensors.tmp." + std::to_string(dead));
  const std::string stale2 = dir.file("train.h5.tmp." + std::to_string(dead));
  const std::string stale3 =
      dir.file(".tmp" + std::to_string(dead) + "-case.nii.gz");  // predict's
  const std::string alive = dir.file("val.h5.tmp." + std::to_string(live));
  const std::string mine = dir.file("x.h5.tmp." + std::to_string(::getpid()));
  const std::vector<std::string> kept = {
      alive,
      mine,
      dir.file("notes.tmp.12x"),                      // not a PID
      dir.file(".tmp." + std::to_string(dead)),       // no name before it
      dir.file("data.tmp.0" + std::to_string(dead)),  // not memtrain's
      dir.file("data.h5"),
      dir.file(".tmp" + std::to_string(dead) + "-notes.txt"),
  };
  // A dead PID's file written after this process started: another host's
  // (a peer rank in a shared folder), kept.
  const std::string young = dir.file("y.h5.tmp." + std::to_string(dead));
  for (const auto& p : kept)
    touch(p);
  touch(stale);
  touch(stale2);
  touch(stale3);
  touch(young, -5);
  testing::internal::CaptureStderr();
  std::vector<std::string> removed =
      remove_stale_temp_files(dir.file("out.h5"));
  const std::string said = testing::internal::GetCapturedStderr();
  ::kill(live, SIGKILL);
  ::waitpid(live, nullptr, 0);
  std::sort(removed.begin(), removed.end());
  std::vector<std::string> want = {stale, stale2, stale3};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(removed, want);
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_FALSE(fs::exists(stale2));
  EXPECT_FALSE(fs::exists(stale3));
  for (const auto& p : kept)
    EXPECT_TRUE(fs::exists(p)) << p;
  EXPECT_TRUE(fs::exists(young));
  EXPECT_TRUE(
      has(said,
          "memtrain: removed stale temporary file '" + stale +
              "' (its writer, process " + std::to_string(dead) +
              ", no longer runs)"))
      << said;
  EXPECT_EQ(std::count(said.begin(), said.end(), '\n'), 3) << said;
}

TEST(StaleTempFiles, TheNextWriterOfTheFolderCleansUp) {
  test::TempDir dir("stale-writer");
  const std::string stale =
      dir.file("metrics.csv.tmp." + std::to_string(dead_pid()));
  touch(stale);
  testing::internal::CaptureStderr();
  write_file_atomically(dir.file("metrics.csv"), "a,b\n");
  const std::string said = testing::internal::GetCapturedStderr();
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(has(said, stale)) << said;

  // make-data, a converter's writer, does the same in its folder.
  test::TempDir dir2("stale-make-data");
  const std::string stale2 =
      dir2.file("train.h5.tmp." + std::to_string(dead_pid()));
  touch(stale2);
  testing::internal::CaptureStderr();
  SyntheticSpec spec;
  spec.samples = 16;
  make_synthetic(spec, dir2.file("train.h5"));
  testing::internal::GetCapturedStderr();
  EXPECT_FALSE(fs::exists(stale2));
  EXPECT_TRUE(fs::exists(dir2.file("train.h5")));
}

// The open descriptors of this process.
size_t open_descriptors() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator("/proc/self/fd"))
    ++n;
  return n;
}

// A writer that throws (any exception, memtrain's own included) leaves no
// descriptor open, no temporary file, and the file it replaces as it was.
TEST(AtomicFile, AThrowingWriterLeavesNothingBehind) {
  test::TempDir dir("throwing-writer");
  const std::string path = dir.file("summary.json");
  write_file_atomically(path, "old\n");
  const size_t before = open_descriptors();
  const auto half_then = [](auto thrown) {
    return [thrown](const std::function<void(const void*, size_t)>& sink) {
      sink("new, half", 9);
      throw thrown;
    };
  };
  EXPECT_THROW(write_file_atomically(path, half_then(Error("no"))), Error);
  EXPECT_THROW(
      write_file_atomically(path, half_then(std::runtime_error("no"))),
      std::runtime_error);
  EXPECT_EQ(open_descriptors(), before);
  EXPECT_FALSE(fs::exists(temp_path_for(path)));
  std::ifstream in(path);
  const std::string kept((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(kept, "old\n");
}

// A 40^3 float32 NIfTI-1 image, 2 mm, identity orientation.
void write_reference(const std::string& path) {
  nifti_1_header h{};
  h.sizeof_hdr = 348;
  h.dim[0] = 3;
  for (int d = 1; d <= 7; ++d)
    h.dim[d] = d <= 3 ? 40 : 1;
  h.datatype = DT_FLOAT32;
  h.bitpix = 32;
  for (int d = 0; d <= 3; ++d)
    h.pixdim[d] = d == 0 ? 1 : 2;
  h.vox_offset = 352;
  h.qform_code = 1;
  h.sform_code = 1;
  h.srow_x[0] = h.srow_y[1] = h.srow_z[2] = 2;
  std::memcpy(h.magic, "n+1", 4);
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(&h), sizeof(h));
  const char ext[4] = {0, 0, 0, 0};
  f.write(ext, 4);
  const std::vector<float> v(40 * 40 * 40, 1.0f);
  f.write(
      reinterpret_cast<const char*>(v.data()),
      static_cast<std::streamsize>(v.size() * sizeof(float)));
}

// Runs `write` in a child process, in a mount namespace of its own with a
// fresh tmpfs of `size` over the folder `disk`; *what gets the message of
// the memtrain::Error it threw ("no error": none) and *left the entries
// it left on the disk. False where no such namespace can be made (not
// root).
bool on_full_disk(
    const test::TempDir& dir,
    const std::string& disk,
    const char* size,
    const std::function<void()>& write,
    std::string* what,
    std::string* left) {
  fs::create_directory(disk);
  const std::string said = dir.file("said.txt");
  const pid_t child = ::fork();
  if (child == 0) {
    if (::unshare(CLONE_NEWNS) != 0 ||
        ::mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        ::mount("tmpfs", disk.c_str(), "tmpfs", 0, size) != 0)
      ::_exit(77);
    std::string message = "no error";
    try {
      write();
    } catch (const Error& e) {
      message = e.what();
    }
    int n = 0;
    for (const auto& e : fs::directory_iterator(disk)) {
      (void)e;
      ++n;
    }
    std::ofstream(said) << message << "\n" << n << "\n";
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status));
  if (!WIFEXITED(status) || WEXITSTATUS(status) == 77)
    return false;
  std::ifstream in(said);
  std::getline(in, *what);
  std::getline(in, *left);
  return true;
}

// predict's NIfTI output onto a full file system (nifti_image_write
// reports nothing): refused with the OS's reason, nothing published, no
// temporary file left. Needs a mount namespace of its own (root): a child
// process mounts a 16 KiB tmpfs over `disk`.
TEST(FullDisk, PredictOutputIsReadBackBeforeItIsPublished) {
  test::TempDir dir("full-disk");
  const std::string ref = dir.file("ref.nii");
  write_reference(ref);
  const std::string disk = dir.file("disk");
  std::string what, left;
  if (!on_full_disk(
          dir,
          disk,
          "size=16k",
          [&] {
            write_nifti_labels_like(
                ref, std::vector<uint8_t>(40 * 40 * 40, 1), disk + "/out.nii");
          },
          &what,
          &left))
    GTEST_SKIP()
        << "(machine) no mount namespace with a tmpfs here (needs root)";
  EXPECT_TRUE(has(what, "predict: cannot write '" + disk + "/out.nii'"))
      << what;
  EXPECT_TRUE(has(what, "No space left on device")) << what;
  EXPECT_EQ(left, "0") << "files left on the full disk";
}

// convert-images at 224 x 224: a class's rows are larger than HDF5's chunk
// cache and go straight to the file, so the append itself fails on a full
// disk; its reason was read after the dataspaces closed, which cleared
// HDF5's error stack: "...in 'FILE': " with nothing after (issue 56,
// point 6).
TEST(FullDisk, ConvertImagesAppendSaysTheDiskIsFull) {
  test::TempDir dir("full-disk");
  RgbImage im;
  im.width = im.height = 64;
  for (int64_t i = 0; i < 64 * 64 * 3; ++i)
    im.rgb.push_back(static_cast<uint8_t>(i * 7));
  for (const char* k : {"cat", "dog"}) {
    fs::create_directories(dir.file(std::string("pics/") + k));
    for (int i = 0; i < 8; ++i)
      write_png(
          dir.file("pics/" + std::string(k) + "/" + std::to_string(i) + ".png"),
          im);
  }
  const std::string disk = dir.file("disk");
  ImageConvertSpec spec;
  spec.folder = dir.file("pics");
  spec.out = disk + "/p.h5";
  spec.size = 224;
  spec.val_fraction = 0.25;
  std::string what, left;
  if (!on_full_disk(
          dir, disk, "size=64k", [&] { convert_images(spec); }, &what, &left))
    GTEST_SKIP()
        << "(machine) no mount namespace with a tmpfs here (needs root)";
  EXPECT_TRUE(has(what, "rows to dataset '/images' in '" + disk + "/p.h5.tmp."))
      << what;
  EXPECT_TRUE(has(what, "': No space left on device (")) << what;
  EXPECT_TRUE(has(what, " bytes free on its file system)")) << what;
  EXPECT_EQ(left, "0") << "files left on the full disk";
}

}  // namespace
}  // namespace memtrain
