#include "memtrain/data/h5/embeddings_file.h"

#include "data/h5/h5_util.h"
#include "data/h5/layout.h"
#include "memtrain/util/error.h"
#include "memtrain/util/temp_path.h"
#include "util/temp_files.h"

namespace memtrain {

void write_embeddings_file(const std::string& path, const EmbeddingsFile& e) {
  remove_stale_temp_files(path);
  TempFiles temps;
  temps.paths.push_back(temp_path_for(path));
  {
    h5::Handle f = h5::create_file(temps.paths[0], "embed");
    const auto n = static_cast<hsize_t>(e.rows);
    const auto d = static_cast<hsize_t>(e.dim);
    h5::write_dataset(
        f.get(),
        layout::kEmbeddingsA,
        H5T_IEEE_F32LE,
        H5T_NATIVE_FLOAT,
        {n, d},
        {},
        e.a);
    h5::write_dataset(
        f.get(),
        layout::kEmbeddingsB,
        H5T_IEEE_F32LE,
        H5T_NATIVE_FLOAT,
        {n, d},
        {},
        e.b);
    if (e.logits != nullptr) {
      h5::write_dataset(
          f.get(),
          layout::kLogits,
          H5T_IEEE_F32LE,
          H5T_NATIVE_FLOAT,
          {n, n},
          {},
          e.logits);
    }
    h5::write_dataset(
        f.get(),
        layout::kPairIds,
        H5T_STD_I64LE,
        H5T_NATIVE_INT64,
        {n},
        {},
        e.pair_ids);
    h5::write_attr(f.get(), layout::kLogitScale, e.logit_scale);
    h5::write_attr(f.get(), layout::kModel, e.model);
    h5::write_attr(f.get(), layout::kWeights, e.weights);
    h5::write_attr(f.get(), layout::kData, e.data);
    h5::finish_file(&f, "embed");
  }
  temps.publish(0, path, "embed");
}

}  // namespace memtrain
