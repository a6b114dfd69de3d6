// train/eval/validator.h's case_host_bytes: what validating one case holds
// in host memory, as the host plan charges it (Note [Host plan]), held to
// the accounting allocator's measured host peak of a real validation.

#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <iostream>
#include <string>

#include "memtrain/config/train_config.h"
#include "memtrain/data/h5/h5_dataset.h"
#include "memtrain/data/synthetic/synthetic.h"
#include "memtrain/dist/mpi_communicator.h"
#include "memtrain/memory/device_memory.h"
#include "memtrain/train/eval/validator.h"
#include "test_support.h"

namespace memtrain {
namespace {

struct Measured {
  int64_t charged = 0;  // host_bytes()
  int64_t peak = 0;     // the host domain's peak during run()
};

// Validates a `channels`-channel, `classes`-class volume file of 2 cases
// of 24 x 20 x 28 voxels with the window `roi`.
Measured validate(
    int64_t classes,
    const std::array<int64_t, 3>& roi,
    Offload offload,
    int64_t sw_batch,
    int64_t channels = 1) {
  test::TempDir dir("valmem");
  SyntheticSpec spec;
  spec.kind = "volumes";
  spec.samples = 2;
  spec.classes = classes;
  spec.channels = channels;
  spec.depth = 24;
  spec.height = 20;
  spec.width = 28;
  spec.chunk = 8;
  spec.split = "val";
  const std::string path = dir.file("val.h5");
  make_synthetic(spec, path);
  const H5Dataset data = H5Dataset::open(path, "data.val");
  ValidationConfig cfg;
  cfg.offload = offload;
  cfg.sw_batch = sw_batch;
  MpiCommunicator comm(MPI_COMM_SELF);
  Validator validator(data, cfg, roi, classes, comm, test::cpu_placement());
  Measured m;
  m.charged = validator.host_bytes();
  // Logits: the window's first channel repeated over the classes.
  const PatchPredictor predict =
      [classes](const at::Tensor& x, const at::Tensor&, const at::Tensor&) {
        return x.narrow(1, 0, 1).repeat({1, classes, 1, 1, 1});
      };
  memory::release_cache();
  memory::reset_peak();
  const memory::Stats before = memory::stats();
  {
    memory::DeviceScope device;
    validator.run(predict);
  }
  m.peak = memory::stats().host_peak - before.host_allocated;
  std::cout << "[          ] classes " << classes << ", roi " << roi[0]
            << ", channels " << channels << ", offload " << to_string(offload)
            << ", sw_batch " << sw_batch << ": charged " << m.charged
            << " B, measured peak " << m.peak << " B\n";
  return m;
}

// The charge bounds the measured peak and is within 5% of it: the
// scoring (six tensors of the probabilities' size) without padding, the
// padded copy and sum with it, with the sum on the host or the device.
TEST(ValidatorMemory, CaseHostBytesBoundsTheMeasuredPeak) {
  ASSERT_TRUE(memory::accounting_installed());
  for (const int64_t classes : {2, 5}) {
    for (const auto& roi :
         {std::array<int64_t, 3>{8, 8, 8},
          std::array<int64_t, 3>{32, 32, 32}}) {
      for (const Offload offload : {Offload::kCpu, Offload::kDevice}) {
        const Measured m = validate(classes, roi, offload, 4);
        EXPECT_LE(m.peak, m.charged);
        EXPECT_GE(m.peak, m.charged * 95 / 100);
      }
    }
  }
  // Many channels, small windows, a large batch of them: the gathered
  // windows dominate the sliding window's phase, the sum on either side.
  for (const Offload offload : {Offload::kCpu, Offload::kDevice}) {
    const Measured m = validate(2, {8, 8, 8}, offload, 64, 12);
    EXPECT_LE(m.peak, m.charged);
    EXPECT_GE(m.peak, m.charged * 95 / 100);
  }
}

// The formula itself, for a case as users have them: 512 x 512 x 300, 14
// classes, the window 96^3 x 4, the sum on the host. Scoring dominates:
// the case (4 + 8 bytes a voxel) and six float tensors of 14 classes.
TEST(ValidatorMemory, CaseHostBytesOfALargeCase) {
  ValidationConfig cfg;
  cfg.sw_batch = 4;
  cfg.offload = Offload::kCpu;
  const int64_t v = int64_t{512} * 512 * 300;
  EXPECT_EQ(
      case_host_bytes({300, 512, 512}, 1, 14, {96, 96, 96}, cfg),
      (4 + 8) * v + 24 * 14 * v + 4096);
}

}  // namespace
}  // namespace memtrain
