#include "memtrain/weights/model_state.h"

#include <sys/stat.h>

#include <fstream>
#include <map>
#include <regex>

#include "memtrain/dist/communicator.h"
#include "memtrain/util/error.h"
#include "memtrain/util/file_kind.h"
#include "memtrain/weights/torch_file.h"
#include "weights/names.h"

namespace memtrain {
namespace {

void collect(
    const torch::nn::Module& m, const std::string& prefix, NamedTensors& out) {
  for (const auto& p : m.named_parameters(/*recurse=*/false)) {
    if (p.value().defined())
      out.emplace_back(prefix + p.key(), p.value());
  }
  for (const auto& b : m.named_buffers(/*recurse=*/false)) {
    if (b.value().defined())
      out.emplace_back(prefix + b.key(), b.value());
  }
  for (const auto& c : m.named_children())
    collect(*c.value(), prefix + c.key() + ".", out);
}

bool matches_prefix(const std::string& name, const std::string& p) {
  if (ends_with(p, "."))
    return name.rfind(p, 0) == 0;
  return name == p || name.rfind(p + ".", 0) == 0;
}

}  // namespace

NamedTensors state_tensors(const torch::nn::Module& model) {
  NamedTensors out;
  collect(model, "", out);
  return out;
}

std::vector<std::string> LoadReport::lines(const std::string& what) const {
  std::vector<std::string> out;
  out.push_back(detail::concat(
      what,
      ": ",
      path,
      entry.empty() ? "" : " ('" + entry + "')",
      ": ",
      loaded.size(),
      " of ",
      model_tensors,
      " tensors loaded"));
  if (renamed > 0) {
    out.push_back(detail::concat(
        what, ": ", renamed, " names renamed by model.pretrained_rename"));
  }
  if (!missing.empty()) {
    out.push_back(detail::concat(
        what,
        ": ",
        missing.size(),
        " missing (in the model, not in the file): ",
        first_few(missing)));
  }
  if (!unexpected.empty()) {
    out.push_back(detail::concat(
        what,
        ": ",
        unexpected.size(),
        " unexpected (in the file, not in the model): ",
        first_few(unexpected)));
  }
  if (!mismatched.empty()) {
    std::vector<std::string> items;
    for (const auto& m : mismatched) {
      items.push_back(
          m.name + " " + shape_text(m.file) + " vs " + shape_text(m.model));
    }
    out.push_back(detail::concat(
        what,
        ": ",
        mismatched.size(),
        " shape-mismatched (file vs model): ",
        first_few(items)));
  }
  if (!counters_absent.empty()) {
    out.push_back(detail::concat(
        what,
        ": ",
        counters_absent.size(),
        " num_batches_tracked counter(s) not in the file, kept (batch-norm "
        "does not read them)"));
  }
  return out;
}

LoadReport load_state(
    torch::nn::Module& model,
    const NamedTensors& file,
    const std::string& path,
    bool strict,
    const std::string& what,
    const std::string& head) {
  const NamedTensors mine = state_tensors(model);
  std::map<std::string, at::Tensor> in_file;
  for (const auto& [name, t] : file)
    in_file.emplace(name, t);
  LoadReport r;
  r.path = path;
  r.model_tensors = static_cast<int64_t>(mine.size());
  std::map<std::string, bool> known;
  NamedTensors to_copy;  // (the model's tensor's name, the file's tensor)
  for (const auto& [name, t] : mine) {
    known[name] = true;
    const auto it = in_file.find(name);
    if (it == in_file.end()) {
      if (ends_with(name, "num_batches_tracked")) {
        r.counters_absent.push_back(name);
      } else {
        r.missing.push_back(name);
      }
    } else if (it->second.sizes() != t.sizes()) {
      r.mismatched.push_back({name, it->second.sizes().vec(), t.sizes().vec()});
    } else {
      r.loaded.push_back(name);
      to_copy.emplace_back(name, it->second);
    }
  }
  for (const auto& [name, t] : file) {
    if (!known.count(name))
      r.unexpected.push_back(name);
  }
  // A file saved from (Distributed)DataParallel: every name "module.*".
  bool all_module = !file.empty();
  for (const auto& [name, t] : file)
    all_module = all_module && name.rfind("module.", 0) == 0;
  const std::string prefix_hint =
      all_module ? "; the file's names all start with 'module.' (saved from "
                   "DataParallel or DistributedDataParallel): add "
                   "model.pretrained_rename: ['^module\\. -> ']"
                 : "";
  if (!strict && r.loaded.empty() && !mine.empty()) {
    std::vector<std::string> theirs, ours;
    for (const auto& [name, t] : file)
      theirs.push_back(name);
    for (const auto& [name, t] : mine)
      ours.push_back(name);
    throw Error(detail::concat(
        what,
        " '",
        path,
        "': none of its ",
        file.size(),
        " tensors matches one of the model's by name and shape (its names: ",
        first_few(theirs, 4),
        "; the model's: ",
        first_few(ours, 4),
        ")",
        prefix_hint));
  }
  if (strict && !r.complete()) {
    // The categories' lines, without the first (the count loaded) and the
    // absent counters' (not a mismatch).
    std::string detail;
    const auto lines = r.lines(what);
    const size_t last = lines.size() - (r.counters_absent.empty() ? 0 : 1);
    for (size_t i = 1; i < last; ++i)
      detail += "; " + lines[i].substr(what.size() + 2);
    bool only_head = !head.empty();
    auto in_head = [&](const std::string& n) {
      return matches_prefix(n, head);
    };
    for (const auto& n : r.missing)
      only_head = only_head && in_head(n);
    for (const auto& n : r.unexpected)
      only_head = only_head && in_head(n);
    for (const auto& m : r.mismatched)
      only_head = only_head && in_head(m.name);
    throw Error(detail::concat(
        what,
        " '",
        path,
        "' does not match the model (",
        what == "model.pretrained" ? "model.pretrained_strict=true" : "strict",
        ")",
        detail,
        only_head && what == "model.pretrained"
            ? "; only the head (" + head +
                  ") differs: set model.pretrained_strict=false to load the "
                  "rest and train a new head"
        : only_head ? "; only the head (" + head +
                          ") differs: the weights are of another class count "
                          "(model.num_classes)"
                    : std::string(
                          what == "model.pretrained"
                              ? "; set model.pretrained_strict=false to load "
                                "what matches and keep model.seed's values for "
                                "the rest"
                              : ""),
        prefix_hint));
  }
  // A NaN or inf in a tensor the model takes makes every step non-finite;
  // said here, it is not blamed on the data or the learning rate windows
  // later. (A tensor the model does not take is not its business.)
  for (const auto& [name, src] : to_copy) {
    if (!src.is_floating_point())
      continue;
    const int64_t bad =
        src.numel() - torch::isfinite(src).sum().item<int64_t>();
    MT_CHECK(
        bad == 0,
        what,
        ": '",
        path,
        "': '",
        name,
        "' holds ",
        bad,
        " non-finite value",
        bad == 1 ? "" : "s",
        " (NaN or inf) of ",
        src.numel(),
        ": the file is damaged, or was saved from a run that diverged");
  }
  torch::NoGradGuard no_grad;
  std::map<std::string, at::Tensor> live;
  for (const auto& [name, t] : mine)
    live.emplace(name, t);
  for (auto& [name, src] : to_copy)
    live.at(name).copy_(src);  // to the model's dtype and device
  return r;
}

int64_t rename_tensors(
    NamedTensors& tensors, const std::vector<std::string>& rules) {
  const std::string arrow = " -> ";
  std::vector<std::string> before;
  for (const auto& [name, t] : tensors)
    before.push_back(name);
  for (const auto& rule : rules) {
    const size_t at = rule.find(arrow);
    MT_CHECK(
        at != std::string::npos,
        "model.pretrained_rename: rule '",
        rule,
        "' has no ' -> ': write 'REGEX -> REPLACEMENT', e.g. "
        "'^module\\. -> ' to drop DataParallel's prefix");
    std::regex from;
    try {
      from = std::regex(rule.substr(0, at), std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      throw Error(
          "model.pretrained_rename: rule '" + rule +
          "': not a regular expression (ECMAScript): " + e.what());
    }
    const std::string to = rule.substr(at + arrow.size());
    std::vector<std::string> now;
    for (const auto& [name, t] : tensors)
      now.push_back(name);
    bool any = false;
    for (auto& [name, t] : tensors) {
      if (std::regex_search(name, from)) {
        any = true;
        name = std::regex_replace(name, from, to);
      }
    }
    MT_CHECK(
        any,
        "model.pretrained_rename: rule '",
        rule,
        "' matches no name of the file (after the rules before it); its "
        "names are ",
        first_few(now, 4));
  }
  std::map<std::string, size_t> seen;
  int64_t changed = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto [it, fresh] = seen.emplace(tensors[i].first, i);
    MT_CHECK(
        fresh,
        before[it->second] == before[i]
            ? "the file holds '" + before[i] + "' twice"
            : "model.pretrained_rename: '" + before[it->second] + "' and '" +
                  before[i] + "' are both renamed to '" + tensors[i].first +
                  "'");
    changed += tensors[i].first != before[i];
  }
  return changed;
}

TorchWeights read_weights_file(
    const std::string& path,
    const std::string& what,
    const std::vector<std::string>& rename,
    int64_t* renamed) {
  TorchWeights file;
  try {
    // Never opened unless a regular file: a FIFO would block the open.
    struct stat st {};
    MT_CHECK(
        ::stat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode),
        "'",
        path,
        "' is ",
        file_kind(st.st_mode),
        ", not a regular file; name a weights file (.safetensors, or a "
        "torch.save .pt/.pth)");
    MT_CHECK(
        std::ifstream(path, std::ios::binary).good(),
        "cannot open '",
        path,
        "'");
    if (is_torch_file(path))
      file = load_torch_weights(path);
    else
      file.tensors = load_safetensors(path);
    *renamed = rename_tensors(file.tensors, rename);
  } catch (const Error& e) {
    throw Error(what + ": " + e.what());
  }
  return file;
}

LoadReport load_weights_file(
    torch::nn::Module& model,
    const std::string& path,
    bool strict,
    const std::string& what,
    const std::vector<std::string>& rename) {
  int64_t renamed = 0;
  const TorchWeights file = read_weights_file(path, what, rename, &renamed);
  std::string head;
  for (const auto& c : model.named_children())
    head = c.key();  // the last registered module: the head
  LoadReport r = load_state(model, file.tensors, path, strict, what, head);
  r.entry = file.entry;
  r.renamed = renamed;
  return r;
}

std::vector<std::string> freeze_parameters(
    torch::nn::Module& model, const std::vector<std::string>& prefixes) {
  std::vector<std::string> frozen, unmatched;
  const auto params = model.named_parameters();
  for (const auto& p : prefixes) {
    bool any = false;
    for (const auto& item : params) {
      if (matches_prefix(item.key(), p)) {
        any = true;
        if (item.value().requires_grad()) {
          item.value().requires_grad_(false);
          frozen.push_back(item.key());
        }
      }
    }
    if (!any)
      unmatched.push_back("'" + p + "'");
  }
  if (!unmatched.empty()) {
    std::vector<std::string> names;
    for (const auto& item : params)
      names.push_back(item.key());
    throw Error(detail::concat(
        "model.freeze: ",
        first_few(unmatched),
        " match",
        unmatched.size() == 1 ? "es" : "",
        " no parameter of the model; a prefix p matches p, p.* (or, "
        "ending in '.', p*); the parameters are ",
        first_few(names, 8)));
  }
  return frozen;
}

void broadcast_buffers(
    Communicator& comm, const std::vector<at::Tensor>& bufs) {
  if (comm.size() == 1 || bufs.empty())
    return;
  torch::NoGradGuard no_grad;
  // One broadcast per dtype: the buffers of that dtype, flattened.
  std::map<c10::ScalarType, std::vector<at::Tensor>> by_type;
  for (const auto& b : bufs)
    by_type[b.scalar_type()].push_back(b);
  for (auto& [type, group] : by_type) {
    std::vector<at::Tensor> flat;
    for (const auto& b : group)
      flat.push_back(b.reshape({-1}));
    at::Tensor all = torch::cat(flat);
    comm.broadcast(all, 0);
    int64_t offset = 0;
    for (auto& b : group) {
      b.copy_(all.narrow(0, offset, b.numel()).view_as(b));
      offset += b.numel();
    }
  }
}

}  // namespace memtrain
