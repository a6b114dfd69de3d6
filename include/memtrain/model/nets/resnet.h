#pragma once
// ResNets for /images (model.name: resnet50, seresnext50_32x4d): the
// architecture of timm's models of those names, with timm's state-dict
// names, so that weights move both ways between memtrain and timm
// (`load_state_dict(strict=True)`):
//
//   conv1 (7x7/2, no bias) -> bn1 -> relu -> 3x3/2 max-pool
//   layer1..layer4: [3, 4, 6, 3] bottlenecks of planes 64, 128, 256, 512
//     (stride 1, 2, 2, 2 on the first block's conv2), each
//     conv1 1x1 -> bn1 -> relu -> conv2 3x3 (groups = cardinality, the
//     stride) -> bn2 -> relu -> conv3 1x1 -> bn3 -> [se] -> + shortcut ->
//     relu; width = floor(planes * base_width / 64) * cardinality, output
//     planes * 4; shortcut = downsample.0 (1x1 conv, stride, no bias) ->
//     downsample.1 (bn) where the shape changes, else the input.
//   se (seresnext50_32x4d): x * sigmoid(fc2(relu(fc1(mean_hw(x))))), fc1
//     and fc2 1x1 convs with bias, channels -> rd -> channels, rd =
//     make_divisible(channels / 16, 8) (timm's SEModule).
//   global average pool -> fc (Linear 2048 -> classes).
// resnet50: cardinality 1, base width 64, no se; seresnext50_32x4d:
// cardinality 32, base width 4, se. With 1000 classes: 25,557,032 and
// 27,559,896 parameters (tests/unit/model/resnet_test.cpp).
//
// Batch-norm (torch::nn::BatchNorm2d: weight, bias, running_mean,
// running_var, num_batches_tracked) trains on each micro-batch's own
// statistics, as PyTorch DDP without SyncBatchNorm does: the update then
// depends on the micro-batch size m (W ranks x K micro-steps x m equal one
// rank with W*K micro-steps of m, not one step on all W*K*m samples).
// With set_batch_norm_sync (model.sync_bn, sync_batch_norm.h) it trains on
// the statistics of all ranks' concurrent micro-batches, as SyncBatchNorm:
// W ranks at m equal one rank at W*m (Note [Batch-norm and data
// parallelism]). Running statistics are buffers, saved with the
// parameters. A batch-norm
// whose weight does not train (model.freeze) normalises with its running
// statistics and leaves them as they are (timm's freeze(): frozen
// batch-norm). The checkpoint segments are the 16 bottlenecks, layer1.0
// first (the largest activations), so a checkpointed window keeps one
// block's input per block and recomputes one block at a time in backward;
// a checkpointed block's recomputation does not update the running
// statistics a second time.

#include <memory>

#include "memtrain/config/train_config.h"
#include "memtrain/model/models.h"

namespace memtrain {

// Builds cfg.name (resnet50 or seresnext50_32x4d) for images of
// `in_channels` channels, initialised from cfg.seed as timm initialises
// (convs Kaiming-normal fan-out, batch-norm 1 and 0, the last batch-norm
// of every block 0, Linear and conv biases as PyTorch's defaults).
std::shared_ptr<Classifier> make_resnet(
    const ModelConfig& cfg, int64_t in_channels, int64_t num_classes);

}  // namespace memtrain
