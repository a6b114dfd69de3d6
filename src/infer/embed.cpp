#include "memtrain/infer/embed.h"

#include <torch/torch.h>

#include <numeric>
#include <vector>

#include "memtrain/data/h5/embeddings_file.h"
#include "memtrain/data/h5/h5_dataset.h"
#include "memtrain/device/placement.h"
#include "memtrain/input/image_augment.h"
#include "memtrain/model/nets/dual_encoder.h"
#include "memtrain/model/registry.h"
#include "memtrain/util/error.h"
#include "memtrain/weights/model_state.h"

namespace memtrain {

EmbedResult embed_pairs(
    const TrainConfig& cfg, const Placement& placement, const EmbedSpec& spec) {
  MT_CHECK(spec.batch > 0, "embed: --batch must be > 0");
  const H5Dataset ds = H5Dataset::open(spec.data, "embed --data");
  const DatasetInfo& info = ds.info();
  MT_CHECK(
      info.paired,
      "embed: --data '",
      spec.data,
      "' is not a pair file (docs/data-format.md, Pairs: /images or "
      "/features_a with /tokens or /features_b)");
  MT_CHECK(
      trains_on(cfg.model.name, kOnPairs | kOnTokenPairs),
      "embed: model.name=",
      cfg.model.name,
      "; embed runs a pair model (",
      models_on(kOnPairs | kOnTokenPairs),
      ")");
  const ModelInput input{
      info.kind,
      info.sample_shape,
      0,
      info.context_features,
      info.tokens,
      info.token_max};
  std::shared_ptr<PairEncoder> model = make_pair_encoder(cfg.model, input);
  load_weights_file(
      *model,
      spec.weights,
      /*strict=*/true,
      "embed --weights",
      cfg.model.pretrained_rename);
  model->to(placement.device());
  model->eval();
  torch::NoGradGuard no_grad;
  const ImageTransform transform =
      resolve_image_transforms(cfg, info, /*episodes_or_pairs=*/true).val;

  const int64_t n = info.num_samples, d = model->embed_dim();
  at::Tensor a = torch::empty({n, d}), b = torch::empty({n, d});
  at::Tensor ids = torch::empty({n}, torch::kLong);
  for (int64_t r0 = 0; r0 < n; r0 += spec.batch) {
    const int64_t m = std::min(spec.batch, n - r0);
    std::vector<int64_t> rows(m);
    std::iota(rows.begin(), rows.end(), r0);
    std::vector<int64_t> x_shape{m};
    x_shape.insert(
        x_shape.end(), info.sample_shape.begin(), info.sample_shape.end());
    at::Tensor x = torch::empty(x_shape);
    at::Tensor ctx = torch::empty({m, info.context_features});
    ds.read(
        rows,
        x.data_ptr<float>(),
        ids.narrow(0, r0, m).data_ptr<int64_t>(),
        ctx.data_ptr<float>());
    if (info.kind == SampleKind::kImages && transform.active())
      transform_images(transform, 0, rows, x);
    const at::Tensor e =
        model->forward(x.to(placement.device()), ctx.to(placement.device()))
            .to(torch::kCPU);
    a.narrow(0, r0, m).copy_(e.select(1, 0));
    b.narrow(0, r0, m).copy_(e.select(1, 1));
  }
  EmbedResult r;
  r.rows = n;
  r.embed_dim = d;
  r.logit_scale = model->logit_scale().exp().item<double>();
  r.logits = n <= spec.max_logits_rows;

  at::Tensor logits;
  if (r.logits)
    logits = (r.logit_scale * a.matmul(b.t())).contiguous();
  EmbeddingsFile file;
  file.rows = n;
  file.dim = d;
  file.a = a.data_ptr<float>();
  file.b = b.data_ptr<float>();
  file.logits = r.logits ? logits.data_ptr<float>() : nullptr;
  file.pair_ids = ids.data_ptr<int64_t>();
  file.logit_scale = r.logit_scale;
  file.model = to_string(cfg.model.name);
  file.weights = spec.weights;
  file.data = spec.data;
  write_embeddings_file(spec.out, file);
  return r;
}

}  // namespace memtrain
