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

// One row per choice key's enum: the enum, then each value with its
// spelling, in `--help`'s order. The row
//   MEMTRAIN_CHOICE(Amp, (kOff, "off"), (kFp16, "fp16"), (kBf16, "bf16"))
// expands to `enum class Amp { kOff, kFp16, kBf16, };` and
// `constexpr std::array<const char*, 3> choice_names(Amp)` = {"off", "fp16",
// "bf16"}: choice_names(E{})[i] spells the value i of E. At most 16 values.
// clang-format off
#define MEMTRAIN_PP_NARG(...) MEMTRAIN_PP_NARG_(__VA_ARGS__, \
    16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
#define MEMTRAIN_PP_NARG_(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, \
    _13, _14, _15, _16, N, ...) N
// clang-format on
#define MEMTRAIN_PP_CAT(a, b) MEMTRAIN_PP_CAT_(a, b)
#define MEMTRAIN_PP_CAT_(a, b) a##b
#define MEMTRAIN_FOR_EACH(m, ...) \
  MEMTRAIN_PP_CAT(MEMTRAIN_FE_, MEMTRAIN_PP_NARG(__VA_ARGS__))(m, __VA_ARGS__)
#define MEMTRAIN_FE_1(m, x) m x
#define MEMTRAIN_FE_2(m, x, ...) m x MEMTRAIN_FE_1(m, __VA_ARGS__)
#define MEMTRAIN_FE_3(m, x, ...) m x MEMTRAIN_FE_2(m, __VA_ARGS__)
#define MEMTRAIN_FE_4(m, x, ...) m x MEMTRAIN_FE_3(m, __VA_ARGS__)
#define MEMTRAIN_FE_5(m, x, ...) m x MEMTRAIN_FE_4(m, __VA_ARGS__)
#define MEMTRAIN_FE_6(m, x, ...) m x MEMTRAIN_FE_5(m, __VA_ARGS__)
#define MEMTRAIN_FE_7(m, x, ...) m x MEMTRAIN_FE_6(m, __VA_ARGS__)
#define MEMTRAIN_FE_8(m, x, ...) m x MEMTRAIN_FE_7(m, __VA_ARGS__)
#define MEMTRAIN_FE_9(m, x, ...) m x MEMTRAIN_FE_8(m, __VA_ARGS__)
#define MEMTRAIN_FE_10(m, x, ...) m x MEMTRAIN_FE_9(m, __VA_ARGS__)
#define MEMTRAIN_FE_11(m, x, ...) m x MEMTRAIN_FE_10(m, __VA_ARGS__)
#define MEMTRAIN_FE_12(m, x, ...) m x MEMTRAIN_FE_11(m, __VA_ARGS__)
#define MEMTRAIN_FE_13(m, x, ...) m x MEMTRAIN_FE_12(m, __VA_ARGS__)
#define MEMTRAIN_FE_14(m, x, ...) m x MEMTRAIN_FE_13(m, __VA_ARGS__)
#define MEMTRAIN_FE_15(m, x, ...) m x MEMTRAIN_FE_14(m, __VA_ARGS__)
#define MEMTRAIN_FE_16(m, x, ...) m x MEMTRAIN_FE_15(m, __VA_ARGS__)
#define MEMTRAIN_CHOICE_VALUE(value, spelling) value,
#define MEMTRAIN_CHOICE_SPELLING(value, spelling) spelling,
#define MEMTRAIN_CHOICE(E, ...)                                           \
  enum class E { MEMTRAIN_FOR_EACH(MEMTRAIN_CHOICE_VALUE, __VA_ARGS__) }; \
  constexpr std::array<const char*, MEMTRAIN_PP_NARG(__VA_ARGS__)>        \
  choice_names(E) {                                                       \
    return {{MEMTRAIN_FOR_EACH(MEMTRAIN_CHOICE_SPELLING, __VA_ARGS__)}};  \
  }

// clang-format off
// model.name (a model's traits are its row in model/registry.cpp)
MEMTRAIN_CHOICE(ModelName,
    (kMlp, "mlp"), (kCnn, "cnn"), (kResnet50, "resnet50"),
    (kSeresnext50, "seresnext50_32x4d"), (kUnet3d, "unet3d"),
    (kDualEncoder, "dual_encoder"), (kSwinUnetr, "swin_unetr"), (kClip, "clip"),
    (kVit, "vit"), (kDinov3, "dinov3"))
// model.feature_cache
MEMTRAIN_CHOICE(FeatureCacheMode, (kNone, "none"), (kHost, "host"))
// model.context.fusion
MEMTRAIN_CHOICE(Fusion, (kConcat, "concat"), (kAdd, "add"))
// model.norm
MEMTRAIN_CHOICE(Norm,
    (kNone, "none"), (kGroup, "group"), (kInstance, "instance"))
// model.head
MEMTRAIN_CHOICE(Head,
    (kLinear, "linear"), (kPrototype, "prototype"), (kCosine, "cosine"),
    (kCosineTransformer, "cosine_transformer"))
// data.flip
MEMTRAIN_CHOICE(Flip, (kNone, "none"), (kW, "w"), (kAll, "all"))
// data.augment
MEMTRAIN_CHOICE(Augment,
    (kAuto, "auto"), (kNone, "none"), (kFlip, "flip"), (kCropFlip, "crop_flip"))
// data.normalize
MEMTRAIN_CHOICE(Normalize,
    (kAuto, "auto"), (kNone, "none"), (kImagenet, "imagenet"), (kClip, "clip"))
// validation.blend
MEMTRAIN_CHOICE(Blend, (kGaussian, "gaussian"), (kConstant, "constant"))
// validation.padding
MEMTRAIN_CHOICE(Padding, (kSymmetric, "symmetric"), (kEnd, "end"))
// validation.offload
MEMTRAIN_CHOICE(Offload, (kCpu, "cpu"), (kDevice, "device"))
// validation.best_mode
MEMTRAIN_CHOICE(BestMode, (kAuto, "auto"), (kMax, "max"), (kMin, "min"))
// training.lr_schedule
MEMTRAIN_CHOICE(LrSchedule,
    (kConstant, "constant"), (kCosine, "cosine"), (kPoly, "poly"))
// training.optimizer
MEMTRAIN_CHOICE(Optimizer, (kSgd, "sgd"), (kAdamw, "adamw"))
// training.nonfinite
MEMTRAIN_CHOICE(Nonfinite, (kSkip, "skip"), (kStop, "stop"))
// training.gradient_checkpointing
MEMTRAIN_CHOICE(Checkpointing,
    (kOff, "off"), (kAll, "all"), (kAuto, "auto"), (kSelective, "selective"),
    (kOffload, "offload"))
// training.contrastive_accumulation
MEMTRAIN_CHOICE(ContrastiveAccumulation, (kExact, "exact"), (kLocal, "local"))
// training.amp
MEMTRAIN_CHOICE(Amp, (kOff, "off"), (kFp16, "fp16"), (kBf16, "bf16"))
// memory.release_cache
MEMTRAIN_CHOICE(ReleaseCache, (kAuto, "auto"), (kNever, "never"))
// memory.test_oom_in
MEMTRAIN_CHOICE(TestOomIn,
    (kMicroStep, "micro_step"), (kBoundaryBackward, "boundary_backward"))
// dist.device (not `Device`: LibTorch has one)
MEMTRAIN_CHOICE(DeviceChoice, (kAuto, "auto"), (kCpu, "cpu"), (kCuda, "cuda"))
// dist.backend
MEMTRAIN_CHOICE(BackendChoice, (kAuto, "auto"), (kMpi, "mpi"), (kNccl, "nccl"))
// dist.check_replicas
MEMTRAIN_CHOICE(CheckReplicas,
    (kOff, "off"), (kEpoch, "epoch"), (kWindow, "window"))
// output.progress (not `Progress`: train/logs/progress.h has one)
MEMTRAIN_CHOICE(ProgressDisplay,
    (kAuto, "auto"), (kTty, "tty"), (kLines, "lines"))
// A switch whose `auto` the run decides (training.cudnn_benchmark,
// model.channels_last).
MEMTRAIN_CHOICE(Switch, (kAuto, "auto"), (kOn, "on"), (kOff, "off"))
// clang-format on

#undef MEMTRAIN_CHOICE
#undef MEMTRAIN_CHOICE_SPELLING
#undef MEMTRAIN_CHOICE_VALUE
#undef MEMTRAIN_FOR_EACH
#undef MEMTRAIN_FE_1
#undef MEMTRAIN_FE_2
#undef MEMTRAIN_FE_3
#undef MEMTRAIN_FE_4
#undef MEMTRAIN_FE_5
#undef MEMTRAIN_FE_6
#undef MEMTRAIN_FE_7
#undef MEMTRAIN_FE_8
#undef MEMTRAIN_FE_9
#undef MEMTRAIN_FE_10
#undef MEMTRAIN_FE_11
#undef MEMTRAIN_FE_12
#undef MEMTRAIN_FE_13
#undef MEMTRAIN_FE_14
#undef MEMTRAIN_FE_15
#undef MEMTRAIN_FE_16
#undef MEMTRAIN_PP_CAT
#undef MEMTRAIN_PP_CAT_
#undef MEMTRAIN_PP_NARG
#undef MEMTRAIN_PP_NARG_

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
