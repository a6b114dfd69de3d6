#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>

#include "agreed.h"
#include "commands.h"
#include "load_config.h"
#include "memtrain/device/placement.h"
#include "memtrain/infer/embed.h"
#include "memtrain/util/error.h"

namespace memtrain::cli {

void add_embed(CLI::App& app, EmbedArgs& args) {
  auto* cmd = app.add_subcommand(
      "embed",
      "Embed a pair file with trained weights (model.name clip or "
      "dual_encoder): every row's two unit embeddings (clip: the image's "
      "and the caption's), the image-text logits exp(logit_scale) a b^T "
      "(open_clip's logits_per_image) and the pair ids, into one HDF5 file "
      "written atomically. One process, float32, on dist.device.");
  cmd->add_option("--config", args.config, "the model's YAML config")
      ->check(CLI::ExistingFile);
  cmd->add_option(
         "--weights",
         args.weights,
         "a weights file (model.safetensors, an open_clip state dict as "
         "safetensors or torch.save's .pt/.pth), loaded strictly after "
         "model.pretrained_rename")
      ->required();
  cmd->add_option("--data", args.spec.data, "a pair file (docs/data-format.md)")
      ->required();
  cmd->add_option("--out", args.spec.out, "the HDF5 file to write")->required();
  cmd->add_option("--batch", args.spec.batch, "rows a forward (default 64)");
  accept_overrides(cmd, args.overrides);
}

int run_embed(EmbedArgs& args) {
  // One process: under mpirun or srun every rank would embed the whole file
  // and race for --out.
  for (const char* n : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"}) {
    const char* v = std::getenv(n);
    MT_CHECK(
        v == nullptr || std::atoi(v) <= 1,
        "embed runs as one process, not under mpirun/srun with ",
        v ? v : "",
        " ranks (",
        n,
        "); run it directly");
  }
  const TrainConfig cfg = load_config(args.config, args.overrides);
  args.spec.weights = args.weights;
  const auto placement =
      Placement::choose(cfg.dist.device, 0, cfg.memory.allocator_conf);
  const EmbedResult r = embed_pairs(cfg, *placement, args.spec);
  std::printf(
      "embedded %lld pairs of %s with %s (d=%lld, logit scale %.6g)%s into "
      "%s\n",
      static_cast<long long>(r.rows),
      args.spec.data.c_str(),
      args.weights.c_str(),
      static_cast<long long>(r.embed_dim),
      r.logit_scale,
      r.logits ? ", logits" : "",
      args.spec.out.c_str());
  return kExitOk;
}

}  // namespace memtrain::cli
