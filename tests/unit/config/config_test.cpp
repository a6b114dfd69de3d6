#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "memtrain/config/train_config.h"
#include "memtrain/model/registry.h"
#include "memtrain/util/error.h"
#include "test_support.h"

namespace memtrain {
namespace {

std::string error_of(
    const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  test::TempDir dir("config");
  const std::string path = dir.file("c.yaml");
  std::ofstream(path) << yaml;
  try {
    check_model_config(TrainConfig::load(path, overrides));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(TrainConfig, DefaultsAreValidAndDocumented) {
  const TrainConfig c = TrainConfig::load("", {});
  EXPECT_EQ(c.model.name, ModelName::kMlp);
  EXPECT_EQ(c.data.batch_size, 16);
  EXPECT_EQ(c.training.gradient_accumulation_steps, 1);
  EXPECT_DOUBLE_EQ(c.dist.bucket_mib, 25.0);
  EXPECT_NE(
      TrainConfig::default_yaml().find("gradient_accumulation_steps: 1"),
      std::string::npos);
}

TEST(TrainConfig, FileAndOverridesApplyInOrder) {
  test::TempDir dir("config");
  const std::string path = dir.file("c.yaml");
  std::ofstream(path) << "training:\n  lr: 0.5\n  optimizer: adamw\n"
                         "  momentum: 0.9\ndata:\n  batch_size: 4\n";
  const TrainConfig c = TrainConfig::load(
      path,
      {"training.lr=0.25",
       "data.val=",
       "training.gradient_accumulation_steps=8"});
  EXPECT_DOUBLE_EQ(c.training.lr, 0.25);
  EXPECT_EQ(c.training.optimizer, Optimizer::kAdamw);
  EXPECT_EQ(c.data.batch_size, 4);
  EXPECT_EQ(c.data.val, "");
  EXPECT_EQ(c.training.gradient_accumulation_steps, 8);
}

TEST(TrainConfig, UnknownKeyIsNamedWithSuggestion) {
  const std::string e = error_of("training:\n  lrr: 0.1\n");
  EXPECT_NE(e.find("unknown key 'training.lrr'"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'training.lr'"), std::string::npos) << e;
  EXPECT_NE(e.find("c.yaml"), std::string::npos) << e;
}

TEST(TrainConfig, UnknownSectionListsSections) {
  const std::string e = error_of("optim:\n  lr: 0.1\n");
  EXPECT_NE(e.find("unknown key 'optim.lr'"), std::string::npos) << e;
  EXPECT_NE(
      e.find(
          "Sections: model, data, validation, training, memory, dist, output"),
      std::string::npos)
      << e;
}

TEST(TrainConfig, WrongTypeNamesKeyValueAndAllowed) {
  const std::string e = error_of("data:\n  batch_size: lots\n");
  EXPECT_NE(e.find("data.batch_size = 'lots'"), std::string::npos) << e;
  EXPECT_NE(e.find("not an integer"), std::string::npos) << e;
  EXPECT_NE(e.find("an integer in [1, "), std::string::npos) << e;
  EXPECT_NE(
      error_of("data:\n  batch_size: 2.5\n").find("not an integer"),
      std::string::npos);
}

TEST(TrainConfig, OutOfRangeAndBadChoice) {
  EXPECT_NE(
      error_of("data:\n  batch_size: 0\n").find("out of range"),
      std::string::npos);
  EXPECT_NE(
      error_of("training:\n  lr: -1\n").find("in (0, 1000]"),
      std::string::npos);
  const std::string e = error_of("training:\n  optimizer: lamb\n");
  EXPECT_NE(e.find("one of sgd, adamw"), std::string::npos) << e;
}

TEST(TrainConfig, AutoBatchNeedsEffectiveBatchAndBudget) {
  EXPECT_NE(
      error_of("data:\n  batch_size: auto\n")
          .find("needs training.effective_batch_size"),
      std::string::npos);
  for (const char* budget : {"none", "\"\""}) {
    const std::string e = error_of(
        std::string("data:\n  batch_size: auto\ntraining:\n"
                    "  effective_batch_size: 64\nmemory:\n"
                    "  budget: ") +
        budget + "\n");
    // "" is not a way to write none (EmptyValuesOnlyWhereTheyMeanSomething).
    EXPECT_NE(
        e.find(
            budget[0] == 'n' ? "needs memory.budget"
                             : "empty; this key needs a value"),
        std::string::npos)
        << e;
  }
  EXPECT_NE(
      error_of("memory:\n  budget: lots\n").find("not a profile"),
      std::string::npos);
}

// memory.budget is parsed once, where it is set: the loaded config holds
// the bytes; a string assigned in code is parsed on the spot; the YAML
// keeps the text as written.
TEST(TrainConfig, BudgetIsParsedWhereItIsSet) {
  const TrainConfig c = TrainConfig::load("", {"memory.budget=1.5GiB"});
  EXPECT_EQ(c.memory.budget.bytes(), int64_t{3} << 29);
  EXPECT_EQ(c.memory.budget.text(), "1.5GiB");
  EXPECT_NE(c.to_yaml().find("budget: \"1.5GiB\""), std::string::npos);
  EXPECT_FALSE(TrainConfig::load("", {}).memory.budget.limited());
  TrainConfig d;
  d.memory.budget = "v100-16gb";
  EXPECT_EQ(d.memory.budget.bytes(), int64_t{16160} << 20);
  d.memory.budget = std::to_string(1900000);
  EXPECT_EQ(d.memory.budget.bytes(), 1900000);
  EXPECT_THROW(d.memory.budget = "v100", Error);
  EXPECT_EQ(d.memory.budget.bytes(), 1900000);  // unchanged by the refusal
}

TEST(TrainConfig, BadOverrideIsNamedAsCommandLine) {
  const std::string e = error_of("", {"training.epochs=many"});
  EXPECT_NE(
      e.find("training.epochs = 'many' (command line)"), std::string::npos)
      << e;
  EXPECT_NE(
      error_of("", {"training.epochs"}).find("section.key=value"),
      std::string::npos);
}

TEST(TrainConfig, MissingFileAndNonMapping) {
  try {
    TrainConfig::load("/nonexistent/x.yaml", {});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("/nonexistent/x.yaml"), std::string::npos);
  }
  EXPECT_NE(error_of("- a\n- b\n").find("mapping"), std::string::npos);
  EXPECT_NE(error_of("lr: 0.1\n").find("must be a section"), std::string::npos);
}

// yaml-cpp keeps both entries of a key written twice; applying them in order
// would silently keep the last (a file that trained with lr 500).
TEST(TrainConfig, KeysAndSectionsWrittenTwiceAreRefusedWithBothLines) {
  const std::string key =
      error_of("training:\n  lr: 0.1\n  epochs: 2\n  lr: 500\n");
  EXPECT_NE(key.find("'training.lr' is written twice (in "), std::string::npos)
      << key;
  EXPECT_NE(key.find("c.yaml), on lines 2 and 4"), std::string::npos) << key;
  const std::string section = error_of(
      "training:\n  lr: 0.1\ndata:\n  batch_size: 4\n"
      "training:\n  lr: 500\n");
  EXPECT_NE(
      section.find("section 'training' is written twice"), std::string::npos)
      << section;
  EXPECT_NE(section.find("on lines 1 and 5"), std::string::npos) << section;
  EXPECT_EQ(
      error_of("training:\n  lr: 0.1\ndata:\n  lr: 0.1\n").find("twice"),
      std::string::npos);  // the same name in two sections is fine
}

// An empty value is a value only where the key says what "" means.
TEST(TrainConfig, EmptyValuesOnlyWhereTheyMeanSomething) {
  for (const std::string& text :
       {error_of("", {"memory.budget="}),
        error_of("memory:\n  budget:\n"),
        error_of("", {"data.train="})}) {
    EXPECT_NE(text.find("empty; this key needs a value"), std::string::npos)
        << text;
  }
  EXPECT_NE(
      error_of("", {"memory.budget="})
          .find("memory.budget = '' (command line)"),
      std::string::npos);
  const TrainConfig c = TrainConfig::load(
      "", {"data.val=", "model.pretrained=", "memory.allocator_conf="});
  EXPECT_EQ(c.data.val, "");
  EXPECT_EQ(c.memory.allocator_conf, "");
}

// --config on a FIFO would block in open() until a writer came; a folder
// is not a file either. Both are refused by what they are.
TEST(TrainConfig, ConfigThatIsNotARegularFileIsRefusedWithoutBlocking) {
  test::TempDir dir("config-fifo");
  const std::string fifo = dir.file("c.yaml");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(
      test::error_of([&] { TrainConfig::load(fifo, {}); }),
      "config: '" + fifo +
          "' is a FIFO, not a regular file; --config reads a YAML file "
          "(every rank reads it): write the configuration to a file");
  EXPECT_NE(
      test::error_of([&] {
        TrainConfig::load(dir.path(), {});
      }).find("' is a directory, not a regular file"),
      std::string::npos);
}

TEST(TrainConfig, OutputDirWithANewlineIsRefused) {
  const std::string e = error_of("", {"output.dir=runs/a\nb"});
  EXPECT_NE(e.find("holds a control character"), std::string::npos) << e;
}

TEST(TrainConfig, ResolvedYamlRoundTrips) {
  TrainConfig c = TrainConfig::load(
      "", {"training.lr=0.125", "model.name=cnn", "data.train=/x y/z.h5"});
  test::TempDir dir("config");
  const std::string path = dir.file("r.yaml");
  std::ofstream(path) << c.to_yaml();
  const TrainConfig back = TrainConfig::load(path, {});
  EXPECT_EQ(back.to_yaml(), c.to_yaml());
  EXPECT_EQ(back.data.train, "/x y/z.h5");
}

// data.prefetch's auto is not one of its depths (0 is one): it reads as
// kPrefetchAuto and writes back as auto; 0 stays 0.
TEST(TrainConfig, PrefetchAutoIsNotADepth) {
  EXPECT_EQ(TrainConfig::load("", {}).data.prefetch, kPrefetchAuto);
  for (const auto& [text, depth] : std::vector<std::pair<std::string, int64_t>>{
           {"auto", kPrefetchAuto}, {"0", 0}, {"3", 3}}) {
    const TrainConfig c = TrainConfig::load("", {"data.prefetch=" + text});
    EXPECT_EQ(c.data.prefetch, depth) << text;
    EXPECT_NE(c.to_yaml().find("prefetch: " + text + "\n"), std::string::npos)
        << c.to_yaml();
  }
  EXPECT_NE(
      error_of("data:\n  prefetch: -1\n")
          .find("auto or an integer in [0, 1024]"),
      std::string::npos)
      << error_of("data:\n  prefetch: -1\n");
}

// A choice is parsed once, where it is set, into its enum; every spelling
// reads back as itself (YAML, messages), in `--help`'s order.
TEST(TrainConfig, ChoicesAreEnumsThatKeepTheirSpelling) {
  const TrainConfig c = TrainConfig::load(
      "",
      {"training.amp=bf16",
       "model.name=unet3d",
       "model.norm=instance",
       "data.flip=all",
       "validation.blend=constant",
       "dist.check_replicas=window"});
  EXPECT_EQ(c.training.amp, Amp::kBf16);
  EXPECT_EQ(c.model.name, ModelName::kUnet3d);
  EXPECT_EQ(c.model.norm, Norm::kInstance);
  EXPECT_EQ(c.data.flip, Flip::kAll);
  EXPECT_EQ(c.validation.blend, Blend::kConstant);
  EXPECT_EQ(c.dist.check_replicas, CheckReplicas::kWindow);
  const std::string yaml = c.to_yaml();
  EXPECT_NE(yaml.find("amp: \"bf16\""), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("check_replicas: \"window\""), std::string::npos);
  for (const char* spelling : choice_names(Checkpointing{})) {
    const TrainConfig t = TrainConfig::load(
        "", {std::string("training.gradient_checkpointing=") + spelling});
    EXPECT_STREQ(to_string(t.training.gradient_checkpointing), spelling);
  }
  EXPECT_EQ(parse_choice<Amp>("fp32"), std::nullopt);
  EXPECT_THROW(choice_of<Amp>("fp32"), std::invalid_argument);
  std::ostringstream out;
  out << Optimizer::kAdamw << " " << ModelName::kSeresnext50;
  EXPECT_EQ(out.str(), "adamw seresnext50_32x4d");
}

// model.norm is refused where it would be ignored: instance is unet3d's,
// and the ResNets normalise with their own batch-norm.
TEST(TrainConfig, NormThatAModelWouldIgnoreIsRefused) {
  const std::string mlp = error_of("model:\n  norm: instance\n");
  EXPECT_NE(mlp.find("model.norm=instance is unet3d's"), std::string::npos)
      << mlp;
  EXPECT_NE(mlp.find("model.name=mlp"), std::string::npos) << mlp;
  const std::string resnet =
      error_of("model:\n  name: resnet50\n  norm: group\n");
  EXPECT_NE(resnet.find("model.norm=group would be ignored"), std::string::npos)
      << resnet;
  EXPECT_EQ(error_of("model:\n  name: cnn\n  norm: group\n"), "");
}

// training.cudnn_benchmark and model.channels_last: auto, on, off; on is
// refused where it contradicts the config.
TEST(TrainConfig, ConvolutionSwitches) {
  const TrainConfig d = TrainConfig::load("", {});
  EXPECT_EQ(d.training.cudnn_benchmark, Switch::kAuto);
  EXPECT_EQ(d.model.channels_last, Switch::kAuto);
  const TrainConfig c = TrainConfig::load(
      "",
      {"model.name=resnet50",
       "model.channels_last=on",
       "training.cudnn_benchmark=off"});
  EXPECT_EQ(c.model.channels_last, Switch::kOn);
  EXPECT_EQ(c.training.cudnn_benchmark, Switch::kOff);
  const std::string mlp = error_of("", {"model.channels_last=on"});
  EXPECT_NE(
      mlp.find("model.channels_last=on is for the 2D convolutional models"),
      std::string::npos)
      << mlp;
  EXPECT_NE(mlp.find("model.name=mlp"), std::string::npos) << mlp;
  const std::string det = error_of(
      "", {"training.cudnn_benchmark=on", "training.deterministic=true"});
  EXPECT_NE(
      det.find("training.cudnn_benchmark=on picks cuDNN's algorithms"),
      std::string::npos)
      << det;
  EXPECT_EQ(error_of("", {"model.channels_last=yes"}).empty(), false);
}

// validation.best_metric names a metric the task reports, so it is a key,
// not a list fixed here: the config checks its shape, the run checks it
// against its task (tests/e2e/regression.sh, augment.sh).
TEST(TrainConfig, BestMetricIsAMetricKey) {
  for (const char* ok : {"auto", "none", "val_loss", "val_rmse", "val_x2"}) {
    EXPECT_EQ(
        TrainConfig::load("", {std::string("validation.best_metric=") + ok})
            .validation.best_metric,
        ok);
  }
  for (const char* bad : {"dice", "val_", "val_Dice", "val dice"}) {
    const std::string e =
        error_of("", {std::string("validation.best_metric=") + bad});
    EXPECT_NE(
        e.find(
            std::string("validation.best_metric = '") + bad +
            "' is not a metric's key"),
        std::string::npos)
        << e;
  }
}

}  // namespace
}  // namespace memtrain
