#pragma once
// Every dataset and attribute name of the HDF5 files memtrain reads and
// writes, in one place: what the readers look for (documented in
// docs/data-format.md) and what the writers (make-data, the converters, embed,
// the volume-rows output) add as provenance. Code spells a dataset or
// attribute name only here; attribute values (kind = "volumes", ...) are
// not names. Datasets are named as H5Dopen2 and H5Lexists take them from
// the file (no leading '/'); path() gives "/volumes" for messages. No HDF5
// or LibTorch here.

#include <cstdint>
#include <string>

namespace memtrain::layout {

// "/NAME": a dataset as messages print it.
inline std::string path(const char* name) {
  return std::string("/") + name;
}

// The layout's version: a root attribute, absent means 1; another value is
// refused.
inline constexpr char kLayoutVersion[] = "layout_version";
inline constexpr int64_t kVersion = 1;

// --- datasets -------------------------------------------------------------
// Samples, one row each (docs/data-format.md "Datasets").
inline constexpr char kFeatures[] = "features";
inline constexpr char kContextFeatures[] = "context_features";
inline constexpr char kImages[] = "images";
inline constexpr char kLabels[] = "labels";
inline constexpr char kVolumes[] = "volumes";
inline constexpr char kMasks[] = "masks";
// Cases of different shapes ("Cases of different shapes").
inline constexpr char kVolumeShapes[] = "volume_shapes";
inline constexpr char kCaseNames[] = "case_names";
inline constexpr char kCaseAffine[] = "case_affine";
inline constexpr char kCaseSourceAffine[] = "case_source_affine";
inline constexpr char kCaseSourceShape[] = "case_source_shape";
// Pairs ("Pairs (contrastive training)").
inline constexpr char kFeaturesA[] = "features_a";
inline constexpr char kFeaturesB[] = "features_b";
inline constexpr char kTokens[] = "tokens";
inline constexpr char kPairIds[] = "pair_ids";
// Regression ("Targets (regression)").
inline constexpr char kTargets[] = "targets";
// Rows that belong to volumes ("Rows that belong to volumes").
inline constexpr char kVolumeIds[] = "volume_ids";
inline constexpr char kVoxelIndex[] = "voxel_index";
// The volume-rows output: one volume's class map (predict on row files).
inline constexpr char kPrediction[] = "prediction";
// convert-captions: each row's caption text.
inline constexpr char kCaptions[] = "captions";
// embed's output: the two towers' embeddings and, for CLIP, the logits.
inline constexpr char kEmbeddingsA[] = "embeddings_a";
inline constexpr char kEmbeddingsB[] = "embeddings_b";
inline constexpr char kLogits[] = "logits";

// --- attributes the readers use ---------------------------------------------
// On the root.
inline constexpr char kKind[] = "kind";
inline constexpr char kNumClasses[] = "num_classes";
inline constexpr char kClassNames[] = "class_names";
inline constexpr char kSpacingMm[] = "spacing_mm";
inline constexpr char kOrientation[] = "orientation";
inline constexpr char kSource[] = "source";
// On /images and /volumes: x = raw * scale + shift.
inline constexpr char kScale[] = "scale";
inline constexpr char kShift[] = "shift";
// On /tokens: the tokenizer's vocabulary, length and special tokens.
inline constexpr char kVocabSize[] = "vocab_size";
inline constexpr char kContextLength[] = "context_length";
inline constexpr char kStartToken[] = "start_token";
inline constexpr char kEndToken[] = "end_token";
inline constexpr char kPadToken[] = "pad_token";

// --- provenance: written, never read back by training -----------------------
inline constexpr char kGenerator[] = "generator";
inline constexpr char kSeed[] = "seed";
inline constexpr char kSplit[] = "split";
inline constexpr char kNoise[] = "noise";
inline constexpr char kLatent[] = "latent";
inline constexpr char kGrid[] = "grid";
inline constexpr char kValFraction[] = "val_fraction";
inline constexpr char kFold[] = "fold";
inline constexpr char kSlab[] = "slab";
inline constexpr char kLabelMap[] = "label_map";
inline constexpr char kResampleMm[] = "resample_mm";
inline constexpr char kNumImages[] = "num_images";
inline constexpr char kImageSize[] = "image_size";
inline constexpr char kImagesPerClass[] = "images_per_class";
inline constexpr char kSkippedFiles[] = "skipped_files";
inline constexpr char kNumPairs[] = "num_pairs";
inline constexpr char kSkippedRows[] = "skipped_rows";
inline constexpr char kTruncatedCaptions[] = "truncated_captions";
inline constexpr char kTokenizer[] = "tokenizer";
// make-data patch-features: how many volumes the rows came from (a root
// attribute, spelled as the dataset /volumes of volume files).
inline constexpr char kVolumeCount[] = "volumes";
// embed's output: what made the features.
inline constexpr char kModel[] = "model";
inline constexpr char kWeights[] = "weights";
inline constexpr char kData[] = "data";
inline constexpr char kLogitScale[] = "logit_scale";
// The volume-rows output: the volume and its Dice.
inline constexpr char kVolumeId[] = "volume_id";
inline constexpr char kDice[] = "dice";

}  // namespace memtrain::layout
