#include <gtest/gtest.h>

#include <fstream>

#include "memtrain/config/train_config.h"
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
    TrainConfig::load(path, overrides);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(TrainConfig, DefaultsAreValidAndDocumented) {
  const TrainConfig c = TrainConfig::load("", {});
  EXPECT_EQ(c.model.name, "mlp");
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
  EXPECT_EQ(c.training.optimizer, "adamw");
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
    EXPECT_NE(e.find("needs memory.budget"), std::string::npos) << e;
  }
  EXPECT_NE(
      error_of("memory:\n  budget: lots\n").find("not a profile"),
      std::string::npos);
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

}  // namespace
}  // namespace memtrain
