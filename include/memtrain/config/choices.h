#pragma once
// The config's enumerations: every choice key of TrainConfig is parsed once,
// when it is read, into one of these, and the tree compares enum values,
// never strings. Each enum's spellings live here, in the order `--help`
// lists them; to_string() and operator<< give the spelling back, so
// messages, the resolved YAML, the banner and every file that stores a
// choice keep the text the user wrote. No LibTorch and no yaml-cpp here:
// data/, dist/, device/ and memory/ take these types too.

#include <array>
#include <cstddef>
#include <optional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

namespace memtrain {

// model.name (a model's traits are its row in model/registry.cpp)
enum class ModelName {
  kMlp,
  kCnn,
  kResnet50,
  kSeresnext50,
  kUnet3d,
  kDualEncoder,
  kSwinUnetr,
  kClip
};
// model.norm
enum class Norm { kNone, kGroup, kInstance };
// model.head
enum class Head { kLinear, kPrototype, kCosine, kCosineTransformer };
// data.flip
enum class Flip { kNone, kW, kAll };
// data.augment
enum class Augment { kAuto, kNone, kFlip, kCropFlip };
// data.normalize
enum class Normalize { kAuto, kNone, kImagenet, kClip };
// validation.blend
enum class Blend { kGaussian, kConstant };
// validation.padding
enum class Padding { kSymmetric, kEnd };
// validation.offload
enum class Offload { kCpu, kDevice };
// validation.best_mode
enum class BestMode { kAuto, kMax, kMin };
// training.lr_schedule
enum class LrSchedule { kConstant, kCosine, kPoly };
// training.optimizer
enum class Optimizer { kSgd, kAdamw };
// training.nonfinite
enum class Nonfinite { kSkip, kStop };
// training.gradient_checkpointing
enum class Checkpointing { kOff, kAll, kAuto, kSelective, kOffload };
// training.contrastive_accumulation
enum class ContrastiveAccumulation { kExact, kLocal };
// training.amp
enum class Amp { kOff, kFp16, kBf16 };
// memory.release_cache
enum class ReleaseCache { kAuto, kNever };
// memory.test_oom_in
enum class TestOomIn { kMicroStep, kBoundaryBackward };
// dist.device (not `Device`: LibTorch has one)
enum class DeviceChoice { kAuto, kCpu, kCuda };
// dist.backend
enum class BackendChoice { kAuto, kMpi, kNccl };
// dist.check_replicas
enum class CheckReplicas { kOff, kEpoch, kWindow };
// output.progress (not `Progress`: train/logs/progress.h has one)
enum class ProgressDisplay { kAuto, kTty, kLines };
// A switch whose `auto` the run decides (training.cudnn_benchmark,
// model.channels_last).
enum class Switch { kAuto, kOn, kOff };

// choice_names(E{})[i] spells the value i of E, in `--help`'s order.
constexpr std::array<const char*, 8> choice_names(ModelName) {
  return {
      {"mlp",
       "cnn",
       "resnet50",
       "seresnext50_32x4d",
       "unet3d",
       "dual_encoder",
       "swin_unetr",
       "clip"}};
}

constexpr std::array<const char*, 3> choice_names(Norm) {
  return {{"none", "group", "instance"}};
}
constexpr std::array<const char*, 4> choice_names(Head) {
  return {{"linear", "prototype", "cosine", "cosine_transformer"}};
}
constexpr std::array<const char*, 3> choice_names(Flip) {
  return {{"none", "w", "all"}};
}
constexpr std::array<const char*, 4> choice_names(Augment) {
  return {{"auto", "none", "flip", "crop_flip"}};
}
constexpr std::array<const char*, 4> choice_names(Normalize) {
  return {{"auto", "none", "imagenet", "clip"}};
}
constexpr std::array<const char*, 2> choice_names(Blend) {
  return {{"gaussian", "constant"}};
}
constexpr std::array<const char*, 2> choice_names(Padding) {
  return {{"symmetric", "end"}};
}
constexpr std::array<const char*, 2> choice_names(Offload) {
  return {{"cpu", "device"}};
}
constexpr std::array<const char*, 3> choice_names(BestMode) {
  return {{"auto", "max", "min"}};
}
constexpr std::array<const char*, 3> choice_names(LrSchedule) {
  return {{"constant", "cosine", "poly"}};
}
constexpr std::array<const char*, 2> choice_names(Optimizer) {
  return {{"sgd", "adamw"}};
}
constexpr std::array<const char*, 2> choice_names(Nonfinite) {
  return {{"skip", "stop"}};
}
constexpr std::array<const char*, 5> choice_names(Checkpointing) {
  return {{"off", "all", "auto", "selective", "offload"}};
}
constexpr std::array<const char*, 2> choice_names(ContrastiveAccumulation) {
  return {{"exact", "local"}};
}
constexpr std::array<const char*, 3> choice_names(Amp) {
  return {{"off", "fp16", "bf16"}};
}
constexpr std::array<const char*, 2> choice_names(ReleaseCache) {
  return {{"auto", "never"}};
}
constexpr std::array<const char*, 2> choice_names(TestOomIn) {
  return {{"micro_step", "boundary_backward"}};
}
constexpr std::array<const char*, 3> choice_names(DeviceChoice) {
  return {{"auto", "cpu", "cuda"}};
}
constexpr std::array<const char*, 3> choice_names(BackendChoice) {
  return {{"auto", "mpi", "nccl"}};
}
constexpr std::array<const char*, 3> choice_names(CheckReplicas) {
  return {{"off", "epoch", "window"}};
}
constexpr std::array<const char*, 3> choice_names(ProgressDisplay) {
  return {{"auto", "tty", "lines"}};
}
constexpr std::array<const char*, 3> choice_names(Switch) {
  return {{"auto", "on", "off"}};
}
// A Switch resolved: `if_auto` (what the run decided) for auto.
constexpr bool switch_on(Switch s, bool if_auto) {
  return s == Switch::kAuto ? if_auto : s == Switch::kOn;
}

template <class E, class = void>
struct IsChoice : std::false_type {};
template <class E>
struct IsChoice<E, std::void_t<decltype(choice_names(E{}))>> : std::true_type {
};

// The spelling of `e` ("bf16" for Amp::kBf16).
template <class E, std::enable_if_t<IsChoice<E>::value, int> = 0>
constexpr const char* to_string(E e) {
  return choice_names(e)[static_cast<std::size_t>(e)];
}

// The value spelled `text`; nullopt if no value is.
template <class E>
std::optional<E> parse_choice(std::string_view text) {
  const auto names = choice_names(E{});
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (text == names[i])
      return static_cast<E>(i);
  }
  return std::nullopt;
}

// The value spelled `text`, for code that takes a choice as text outside
// the config (a benchmark's flag, a test's table). Throws
// std::invalid_argument listing the spellings when none is `text`.
template <class E>
E choice_of(std::string_view text) {
  if (const std::optional<E> v = parse_choice<E>(text))
    return *v;
  std::string allowed;
  for (const char* name : choice_names(E{}))
    allowed += (allowed.empty() ? "" : ", ") + std::string(name);
  throw std::invalid_argument(
      "'" + std::string(text) + "' is not one of " + allowed);
}

// Messages and logs print the spelling.
template <class E, std::enable_if_t<IsChoice<E>::value, int> = 0>
std::ostream& operator<<(std::ostream& out, E e) {
  return out << to_string(e);
}

}  // namespace memtrain
