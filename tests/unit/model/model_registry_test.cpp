#include <gtest/gtest.h>

#include <string>

#include "memtrain/config/train_config.h"
#include "memtrain/model/registry.h"
#include "memtrain/util/error.h"

using namespace memtrain;

// Every ModelName has its row, in the enum's order, with one factory and
// banner words.
TEST(ModelRegistry, OneRowPerModelName) {
  const auto names = choice_names(ModelName{});
  ASSERT_EQ(model_rows().size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    const ModelRow& r = model_rows()[i];
    EXPECT_STREQ(to_string(r.name), names[i]);
    EXPECT_NE(r.make == nullptr, r.make_pair == nullptr) << names[i];
    EXPECT_NE(r.words, nullptr) << names[i];
    EXPECT_NE(r.trains_on, 0u) << names[i];
  }
}

// The lists that messages print come from the rows' traits.
TEST(ModelRegistry, TraitsGiveTheListsMessagesPrint) {
  EXPECT_EQ(models_with(&ModelRow::conv2d), "cnn, resnet50, seresnext50_32x4d");
  EXPECT_EQ(models_with(&ModelRow::batch_norm), "resnet50, seresnext50_32x4d");
  EXPECT_EQ(models_on(kOnVolumes), "unet3d, swin_unetr or dinov3");
  EXPECT_EQ(models_on(kOnPairs | kOnTokenPairs), "dual_encoder or clip");
  EXPECT_TRUE(trains_on(ModelName::kSeresnext50, kOnImages));
  EXPECT_FALSE(trains_on(ModelName::kSeresnext50, kOnFeatures));
  EXPECT_TRUE(model_row(ModelName::kResnet50).imagenet_images);
  EXPECT_TRUE(model_row(ModelName::kClip).clip_images);
  EXPECT_FALSE(model_row(ModelName::kCnn).imagenet_images);
}

TEST(ModelRegistry, FeatureSizeIsTheModelsOwnUnlessGiven) {
  ModelConfig m;
  m.name = ModelName::kUnet3d;
  EXPECT_EQ(model_feature_size(m), 16);
  m.name = ModelName::kSwinUnetr;
  EXPECT_EQ(model_feature_size(m), 48);
  m.feature_size = 24;
  EXPECT_EQ(model_feature_size(m), 24);
}

// The data a model cannot train on is refused with every model's input.
TEST(ModelRegistry, AModelOnDataItCannotTrainOnIsRefused) {
  try {
    check_model_fits(ModelName::kUnet3d, SampleKind::kFeatures, false, "f.h5");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(
        std::string(e.what()),
        "model.name=unet3d cannot train on features (f.h5); use "
        "model.name=mlp (mlp: /features, cnn, resnet50, "
        "seresnext50_32x4d or vit: /images, unet3d, swin_unetr or dinov3: "
        "/volumes, "
        "dual_encoder: pairs of /features_a or /images with /features_b, "
        "clip: pairs of /images and /tokens)");
  }
  EXPECT_NO_THROW(
      check_model_fits(ModelName::kSwinUnetr, SampleKind::kVolumes, false, ""));
  EXPECT_NO_THROW(
      check_model_fits(ModelName::kClip, SampleKind::kImages, true, ""));
  EXPECT_THROW(
      check_model_fits(ModelName::kMlp, SampleKind::kFeatures, true, ""),
      Error);
}

// The model rules read the row: a pair model refuses episodes, group norm
// is refused where the row says why.
TEST(ModelRegistry, ModelRulesComeFromTheRow) {
  TrainConfig c;
  c.model.name = ModelName::kSwinUnetr;
  c.model.norm = Norm::kGroup;
  try {
    check_model_config(c);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find(
            "config: model.name=swin_unetr normalises as MONAI's SwinUNETR"),
        std::string::npos)
        << e.what();
  }
  c.model.norm = Norm::kInstance;
  EXPECT_NO_THROW(check_model_config(c));
  c.model.name = ModelName::kClip;
  c.model.norm = Norm::kNone;
  c.data.episodes.n_way = 5;
  EXPECT_THROW(check_model_config(c), Error);
}
