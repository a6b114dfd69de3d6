#include "memtrain/data/h5/inspect.h"

#include <algorithm>
#include <array>
#include <sstream>
#include <vector>

#include "data/h5/h5_util.h"
#include "data/h5/layout.h"
#include "memtrain/data/h5/h5_dataset.h"
#include "memtrain/data/h5/volume_rows.h"
#include "memtrain/util/error.h"

namespace memtrain {
namespace {

std::string dims_text(const std::vector<hsize_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    s += (i ? ", " : "") + std::to_string(dims[i]);
  }
  return s + "]";
}

void describe_dataset(
    hid_t file, const std::string& name, std::ostringstream& out) {
  h5::Handle ds = h5::dataset(H5Dopen2(file, name.c_str(), H5P_DEFAULT));
  if (!ds.valid()) {
    out << "  /" << name << ": cannot open: " << h5::last_error() << "\n";
    return;
  }
  out << "  /" << name << "  " << h5::type_name(ds.get()) << " "
      << dims_text(h5::dims_of(ds.get()));
  h5::Handle dcpl = h5::plist(H5Dget_create_plist(ds.get()));
  if (H5Pget_layout(dcpl.get()) == H5D_CHUNKED) {
    std::vector<hsize_t> chunk(h5::dims_of(ds.get()).size());
    H5Pget_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data());
    out << "  chunks " << dims_text(chunk);
  } else {
    out << "  contiguous";
  }
  out << "\n";
}

// A ragged volume file: how many cases, their smallest and largest
// extents on each axis, and the first few cases by name and shape.
std::string describe_case_shapes(const DatasetInfo& info) {
  std::array<int64_t, 3> lo = info.volume_shapes.at(0), hi = lo;
  for (const auto& e : info.volume_shapes) {
    for (int a = 0; a < 3; ++a) {
      lo[a] = std::min(lo[a], e[a]);
      hi[a] = std::max(hi[a], e[a]);
    }
  }
  std::ostringstream out;
  out << "cases of different shapes: " << info.volume_shapes.size()
      << ", from [" << lo[0] << ", " << lo[1] << ", " << lo[2] << "] to ["
      << hi[0] << ", " << hi[1] << ", " << hi[2] << "] voxels (d, h, w):";
  const size_t shown = std::min<size_t>(info.volume_shapes.size(), 8);
  for (size_t v = 0; v < shown; ++v) {
    const auto& e = info.volume_shapes[v];
    out << (v ? "," : "") << " " << info.volume_name(static_cast<int64_t>(v))
        << " [" << e[0] << ", " << e[1] << ", " << e[2] << "]";
  }
  if (shown < info.volume_shapes.size())
    out << ", ...";
  return out.str();
}

}  // namespace

InspectReport inspect_file(const std::string& path) {
  h5::silence_errors();
  InspectReport report;
  std::ostringstream out;
  out << "file: " << path << "\n";
  if (H5Fis_hdf5(path.c_str()) > 0) {
    h5::Handle file =
        h5::file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    if (file.valid()) {
      out << "attributes:\n";
      for (const char* a :
           {layout::kLayoutVersion,
            layout::kKind,
            layout::kNumClasses,
            layout::kClassNames,
            layout::kGenerator,
            layout::kSeed,
            layout::kSplit,
            layout::kSource}) {
        std::string s;
        int64_t i = 0;
        double d = 0;
        try {
          if (h5::read_attr(file.get(), a, &s)) {
            out << "  " << a << " = \"" << s << "\"\n";
          }
        } catch (const Error&) {
          try {
            if (h5::read_attr(file.get(), a, &i)) {
              out << "  " << a << " = " << i << "\n";
            }
          } catch (const Error&) {
            if (h5::read_attr(file.get(), a, &d)) {
              out << "  " << a << " = " << d << "\n";
            }
          }
        }
      }
      out << "datasets:\n";
      std::vector<std::string> names;
      H5Literate(
          file.get(),
          H5_INDEX_NAME,
          H5_ITER_INC,
          nullptr,
          [](hid_t, const char* name, const H5L_info_t*, void* data) {
            static_cast<std::vector<std::string>*>(data)->push_back(name);
            return herr_t{0};
          },
          &names);
      for (const auto& n : names) {
        const hid_t obj = H5Oopen(file.get(), n.c_str(), H5P_DEFAULT);
        const bool is_dataset = obj >= 0 && H5Iget_type(obj) == H5I_DATASET;
        if (obj >= 0)
          H5Oclose(obj);
        if (is_dataset) {
          describe_dataset(file.get(), n, out);
        } else {
          out << "  /" << n << "  (not a dataset)\n";
        }
      }
    }
  }
  try {
    const H5Dataset ds = H5Dataset::open(path, "inspect");
    const DatasetInfo& info = ds.info();
    if (info.paired) {
      out << "layout: pairs, " << info.num_samples
          << " rows: " << info.sample_dataset << " [";
      for (size_t i = 0; i < info.sample_shape.size(); ++i)
        out << (i ? ", " : "") << info.sample_shape[i];
      out << "] " << info.sample_dtype << " with " << info.context_dataset()
          << " [" << info.context_features << "]";
      if (info.tokens)
        out << " (token ids 0.." << info.token_max << ")";
      out << "\npair ids: ";
      if (info.row_labels.empty()) {
        out << "none (row i of both is pair i)";
      } else {
        std::vector<int64_t> ids = info.row_labels;
        std::sort(ids.begin(), ids.end());
        out << (std::unique(ids.begin(), ids.end()) - ids.begin())
            << " distinct (rows sharing an id are not each other's "
               "negatives)";
      }
      out << "\nproblems: none\n";
      report.ok = true;
      report.text = out.str();
      return report;
    }
    out << "layout: " << to_string(info.kind) << ", " << info.num_samples
        << " samples of shape [";
    for (size_t i = 0; i < info.sample_shape.size(); ++i) {
      out << (i ? ", " : "") << info.sample_shape[i];
    }
    out << "] " << info.sample_dtype << ", ";
    if (info.targets > 0)
      out << info.targets << " targets a row (/targets: regression)";
    else
      out << info.num_classes << " classes";
    if (info.context_features > 0)
      out << ", context features " << info.context_features;
    if (info.has_volume_rows)
      out << "\nvolume rows: " << describe_volume_rows(index_volume_rows(info));
    if (info.kind == SampleKind::kVolumes) {
      out << "\nintensity: x = raw * " << info.scale << " + " << info.shift;
      if (info.spacing_mm[0] > 0) {
        out << "; spacing " << info.spacing_mm[0] << " x " << info.spacing_mm[1]
            << " x " << info.spacing_mm[2] << " mm";
      }
      if (info.ragged)
        out << "\n" << describe_case_shapes(info);
      out << "\nvoxels per class:";
    } else if (info.targets == 0) {
      out << "\nlabels:";
    }
    for (int64_t c = 0; c < info.num_classes; ++c) {
      const std::string name = c < static_cast<int64_t>(info.class_names.size())
                                   ? info.class_names[c]
                                   : std::to_string(c);
      out << " " << name << "=" << info.label_counts[c];
    }
    out << "\n";
    if (info.kind == SampleKind::kVolumes) {
      // Patch reads: a layout that only suits whole-volume reads is not an
      // error, but training on it is slow. Judged against a 32^3 patch
      // (or the volume, when smaller).
      std::array<int64_t, 3> patch;
      for (int i = 0; i < 3; ++i)
        patch[i] = std::min<int64_t>(32, info.sample_shape[i + 1]);
      const std::string warn = ds.patch_layout_warning(patch);
      if (!warn.empty())
        out << "warning: " << warn << "\n";
    }
    out << "problems: none\n";
    report.ok = true;
  } catch (const Error& e) {
    out << "problems:\n  " << e.what() << "\n";
  }
  report.text = out.str();
  return report;
}

}  // namespace memtrain
