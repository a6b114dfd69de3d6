#include "memtrain/weights/torch_file.h"

#include <torch/torch.h>

#include <cstring>
#include <fstream>
#include <memory>
#include <unordered_map>

#include "memtrain/util/error.h"
#include "weights/torch_zip.h"

namespace memtrain {
namespace {

// A value of the pickle. Python objects memtrain has no use for (an
// optimizer's state, numpy scalars, a class instance) are kObject: their
// constructor's name is kept, nothing is called. Every value is owned by
// the Unpickler's arena and points at others by raw pointer, so that a
// deeply nested or cyclic pickle neither recurses in destructors nor leaks.
struct Obj;
using V = Obj*;
struct Obj {
  enum Kind {
    kNone,
    kBool,
    kInt,
    kFloat,
    kStr,
    kBytes,
    kTuple,
    kList,
    kDict,
    kGlobal,  // a class or function named by GLOBAL: s = "module.name"
    kObject,  // what calling a kGlobal made: s = its name
    kStorage,
    kTensor,
  } kind = kNone;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::vector<V> items;                  // kTuple, kList (sets too)
  std::vector<std::pair<V, V>> entries;  // kDict; kObject's SETITEMS
  at::Tensor tensor;                     // kTensor; kStorage (1-D)
};

const char* kind_name(const Obj& v) {
  static const char* const names[] = {
      "None",
      "a bool",
      "an int",
      "a float",
      "a string",
      "bytes",
      "a tuple",
      "a list",
      "a dict",
      "a class",
      "an object",
      "a storage",
      "a tensor"};
  return names[v.kind];
}

// a * b + c into *out, false on overflow.
bool mul_add(int64_t a, int64_t b, int64_t c, int64_t* out) {
  int64_t ab = 0;
  return !__builtin_mul_overflow(a, b, &ab) &&
         !__builtin_add_overflow(ab, c, out);
}

struct StorageType {
  const char* name;
  at::ScalarType type;
};

// The typed storages torch.save names (torch.FloatStorage, ...); an
// UntypedStorage is bytes.
constexpr StorageType kStorages[] = {
    {"torch.FloatStorage", at::kFloat},
    {"torch.DoubleStorage", at::kDouble},
    {"torch.HalfStorage", at::kHalf},
    {"torch.BFloat16Storage", at::kBFloat16},
    {"torch.LongStorage", at::kLong},
    {"torch.IntStorage", at::kInt},
    {"torch.ShortStorage", at::kShort},
    {"torch.CharStorage", at::kChar},
    {"torch.ByteStorage", at::kByte},
    {"torch.BoolStorage", at::kBool},
    {"torch.UntypedStorage", at::kByte},
};

class Unpickler {
 public:
  V make(Obj::Kind k) {
    arena_.push_back(std::make_unique<Obj>());
    arena_.back()->kind = k;
    return arena_.back().get();
  }
  V make_str(Obj::Kind k, std::string s) {
    V v = make(k);
    v->s = std::move(s);
    return v;
  }

  Unpickler(
      const std::string& path, TorchZip& zip, const char* data, size_t size)
      : path_(path), zip_(zip), p_(data), size_(size) {}

  V run() {
    for (;;) {
      const uint8_t op = u8();
      switch (op) {
        case 0x80:  // PROTO
          u8();
          break;
        case 0x95:  // FRAME
          take(8);
          break;
        case '.':  // STOP
          return pop();
        case '(':  // MARK
          marks_.push_back(stack_.size());
          break;
        case 'N':
          push(make(Obj::kNone));
          break;
        case 0x88:    // NEWTRUE
        case 0x89: {  // NEWFALSE
          V v = make(Obj::kBool);
          v->i = op == 0x88;
          push(v);
          break;
        }
        case 'J':
          push_int(static_cast<int32_t>(le(4)));
          break;
        case 'K':
          push_int(static_cast<int64_t>(le(1)));
          break;
        case 'M':
          push_int(static_cast<int64_t>(le(2)));
          break;
        case 0x8a:  // LONG1
          push_long(u8());
          break;
        case 0x8b:  // LONG4
          push_long(le(4));
          break;
        case 'G': {  // BINFLOAT: big-endian double
          uint64_t bits = 0;
          for (const char c : take(8))
            bits = (bits << 8) | static_cast<uint8_t>(c);
          V v = make(Obj::kFloat);
          std::memcpy(&v->f, &bits, 8);
          push(v);
          break;
        }
        case 'X':  // BINUNICODE
          push(make_str(Obj::kStr, take(le(4))));
          break;
        case 0x8c:  // SHORT_BINUNICODE
          push(make_str(Obj::kStr, take(u8())));
          break;
        case 0x8d:  // BINUNICODE8
          push(make_str(Obj::kStr, take(le(8))));
          break;
        case 'T':  // BINSTRING
          push(make_str(Obj::kBytes, take(le(4))));
          break;
        case 'U':  // SHORT_BINSTRING
        case 'C':  // SHORT_BINBYTES
          push(make_str(Obj::kBytes, take(u8())));
          break;
        case 'B':  // BINBYTES
          push(make_str(Obj::kBytes, take(le(4))));
          break;
        case 0x8e:  // BINBYTES8
        case 0x96:  // BYTEARRAY8
          push(make_str(Obj::kBytes, take(le(8))));
          break;
        case 0x8f:  // EMPTY_SET: kept as a list
          push(make(Obj::kList));
          break;
        case 0x90: {  // ADDITEMS
          auto xs = pop_mark();
          V set = top();
          set->items.insert(set->items.end(), xs.begin(), xs.end());
          break;
        }
        case 0x91: {  // FROZENSET
          V v = make(Obj::kList);
          v->items = pop_mark();
          push(v);
          break;
        }
        case '}':
          push(make(Obj::kDict));
          break;
        case ']':
          push(make(Obj::kList));
          break;
        case ')':
          push(make(Obj::kTuple));
          break;
        case 't':
        case 'l': {  // TUPLE, LIST: the items since the mark
          V v = make(op == 't' ? Obj::kTuple : Obj::kList);
          v->items = pop_mark();
          push(v);
          break;
        }
        case 0x85:    // TUPLE1
        case 0x86:    // TUPLE2
        case 0x87: {  // TUPLE3
          const size_t n = op - 0x84u;
          need(n);
          V v = make(Obj::kTuple);
          v->items.assign(stack_.end() - n, stack_.end());
          stack_.resize(stack_.size() - n);
          push(v);
          break;
        }
        case 'd': {  // DICT: key, value pairs since the mark
          V v = make(Obj::kDict);
          set_items(v, pop_mark());
          push(v);
          break;
        }
        case 'a': {  // APPEND
          V x = pop();
          top()->items.push_back(x);
          break;
        }
        case 'e': {  // APPENDS
          auto xs = pop_mark();
          V list = top();
          list->items.insert(list->items.end(), xs.begin(), xs.end());
          break;
        }
        case 's': {  // SETITEM
          V value = pop();
          V key = pop();
          set_items(top(), {key, value});
          break;
        }
        case 'u': {  // SETITEMS
          auto kv = pop_mark();
          set_items(top(), kv);
          break;
        }
        case 'q':  // BINPUT
          memo_[u8()] = top();
          break;
        case 'r':  // LONG_BINPUT
          memo_[le(4)] = top();
          break;
        case 0x94:  // MEMOIZE
          memo_[memo_.size()] = top();
          break;
        case 'h':  // BINGET
          push(memo(u8()));
          break;
        case 'j':  // LONG_BINGET
          push(memo(le(4)));
          break;
        case '0':  // POP
          pop();
          break;
        case '1':  // POP_MARK
          pop_mark();
          break;
        case '2':  // DUP
          push(top());
          break;
        case 'c': {  // GLOBAL module\nname\n
          std::string module = line();
          push(make_str(Obj::kGlobal, module + "." + line()));
          break;
        }
        case 0x93: {  // STACK_GLOBAL
          V name = pop();
          V module = pop();
          push(make_str(Obj::kGlobal, module->s + "." + name->s));
          break;
        }
        case 'R': {  // REDUCE: callable(*args)
          V args = pop();
          V callable = pop();
          push(call(callable, args));
          break;
        }
        case 0x81: {  // NEWOBJ: cls.__new__(cls, *args)
          pop();      // args
          push(object_of(pop()));
          break;
        }
        case 0x92: {  // NEWOBJ_EX: cls, args, kwargs
          pop();
          pop();
          push(object_of(pop()));
          break;
        }
        case 'b':  // BUILD: an object's state (an OrderedDict's
          pop();   // _metadata, an instance's __dict__): not needed
          break;
        case 'Q':  // BINPERSID: a storage
          push(storage(pop()));
          break;
        default:
          fail(detail::concat(
              "unsupported pickle opcode 0x",
              std::hex,
              static_cast<int>(op),
              std::dec,
              " at byte ",
              pos_ - 1,
              " (a pickle memtrain does not read: save the state dict "
              "with torch.save)"));
      }
    }
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw Error("'" + path_ + "': data.pkl: " + what);
  }

  std::string take(uint64_t n) {
    if (n > size_ - pos_)
      fail(detail::concat("truncated at byte ", pos_, " (a damaged file?)"));
    std::string s(p_ + pos_, n);
    pos_ += n;
    return s;
  }
  uint8_t u8() {
    return static_cast<uint8_t>(take(1)[0]);
  }
  uint64_t le(int n) {
    const std::string b = take(n);
    uint64_t v = 0;
    for (int k = n - 1; k >= 0; --k)
      v = (v << 8) | static_cast<uint8_t>(b[k]);
    return v;
  }
  std::string line() {
    std::string s;
    for (char c = static_cast<char>(u8()); c != '\n';
         c = static_cast<char>(u8()))
      s += c;
    return s;
  }

  void push(V v) {
    stack_.push_back(v);
  }
  void push_int(int64_t x) {
    V v = make(Obj::kInt);
    v->i = x;
    push(v);
  }
  // LONG1/LONG4: n bytes, little-endian two's complement. Past 8 bytes
  // the value is kept as an inert object (no state dict needs one).
  void push_long(uint64_t n) {
    const std::string b = take(n);
    if (n > 8) {
      push(make_str(Obj::kObject, "int"));
      return;
    }
    uint64_t v = 0;
    for (size_t k = n; k-- > 0;)
      v = (v << 8) | static_cast<uint8_t>(b[k]);
    if (n > 0 && n < 8 && (static_cast<uint8_t>(b[n - 1]) & 0x80))
      v |= ~uint64_t{0} << (8 * n);  // sign-extend
    push_int(static_cast<int64_t>(v));
  }
  void need(size_t n) const {
    if (stack_.size() < n + (marks_.empty() ? 0 : marks_.back()))
      fail(detail::concat("stack underflow at byte ", pos_));
  }
  V pop() {
    need(1);
    V v = stack_.back();
    stack_.pop_back();
    return v;
  }
  V top() const {
    need(1);
    return stack_.back();
  }
  std::vector<V> pop_mark() {
    if (marks_.empty())
      fail(detail::concat("no mark at byte ", pos_));
    const size_t m = marks_.back();
    marks_.pop_back();
    std::vector<V> out(stack_.begin() + m, stack_.end());
    stack_.resize(m);
    return out;
  }
  V memo(uint64_t k) const {
    const auto it = memo_.find(k);
    if (it == memo_.end())
      fail(detail::concat("memo ", k, " read before it was written"));
    return it->second;
  }

  void set_items(const V& target, const std::vector<V>& kv) {
    if (kv.size() % 2 != 0)
      fail(detail::concat("odd number of dict items at byte ", pos_));
    for (size_t k = 0; k < kv.size(); k += 2)
      target->entries.emplace_back(kv[k], kv[k + 1]);
  }

  V object_of(const V& cls) {
    return make_str(Obj::kObject, cls->kind == Obj::kGlobal ? cls->s : "?");
  }

  // The constructors a state dict is made of; anything else is inert.
  V call(const V& fn, const V& args) {
    const std::string& name = fn->kind == Obj::kGlobal ? fn->s : "";
    const auto& a = args->items;
    if (name == "collections.OrderedDict" && a.empty())
      return make(Obj::kDict);
    if (name == "torch._utils._rebuild_tensor_v2" ||
        name == "torch._utils._rebuild_tensor")
      return tensor(a);
    if ((name == "torch._utils._rebuild_parameter" ||
         name == "torch._utils._rebuild_parameter_with_state") &&
        !a.empty() && a[0]->kind == Obj::kTensor)
      return a[0];  // a Parameter's data
    return object_of(fn);
  }

  std::vector<int64_t> ints(const V& v, const char* what) const {
    if (v->kind != Obj::kTuple && v->kind != Obj::kList)
      fail(detail::concat("a tensor's ", what, " is not a tuple"));
    std::vector<int64_t> out;
    for (const auto& x : v->items) {
      if (x->kind != Obj::kInt)
        fail(detail::concat("a tensor's ", what, " holds a non-integer"));
      out.push_back(x->i);
    }
    return out;
  }

  // _rebuild_tensor_v2(storage, storage_offset, size, stride, ...): a view
  // of the storage, checked to lie inside it.
  V tensor(const std::vector<V>& a) {
    if (!a.empty() && a[0]->kind == Obj::kObject)  // a storage kept inert
      return make_str(
          Obj::kObject, "torch._utils._rebuild_tensor_v2 of a " + a[0]->s);
    if (a.size() < 4 || a[0]->kind != Obj::kStorage || a[1]->kind != Obj::kInt)
      fail("a tensor without a storage, offset, size and stride");
    const at::Tensor& storage = a[0]->tensor;
    const int64_t offset = a[1]->i;
    const auto size = ints(a[2], "size");
    const auto stride = ints(a[3], "stride");
    if (size.size() != stride.size() || offset < 0)
      fail("a tensor whose size and stride differ in length");
    int64_t last = offset, numel = 1;
    for (size_t d = 0; d < size.size(); ++d) {
      if (size[d] < 0 || stride[d] < 0)
        fail("a tensor with a negative size or stride");
      if (!mul_add(numel, size[d], 0, &numel))
        fail("a tensor whose size overflows");
    }
    for (size_t d = 0; numel > 0 && d < size.size(); ++d) {
      if (!mul_add(size[d] - 1, stride[d], last, &last))
        fail("a tensor whose extent overflows");
    }
    if (numel > 0 && last >= storage.numel())
      fail(detail::concat(
          "a tensor reaching element ",
          last,
          " of a storage of ",
          storage.numel(),
          " (a damaged file?)"));
    V v = make(Obj::kTensor);
    v->tensor = storage.as_strided(size, stride, offset);
    // _rebuild_tensor_v2's 7th argument: the tensor's bits ({"neg": True}
    // for a lazily negated view, saved as the unnegated data).
    if (a.size() > 6 && a[6]->kind == Obj::kDict) {
      for (const auto& [k, x] : a[6]->entries) {
        const bool on = x->kind == Obj::kBool && x->i != 0;
        if (k->kind == Obj::kStr && k->s == "neg" && on)
          v->tensor = v->tensor.neg();
        else if (on || x->kind != Obj::kBool)
          return make_str(
              Obj::kObject, "torch._utils._rebuild_tensor_v2 with " + k->s);
      }
    }
    return v;
  }

  // ('storage', storage type, key, location, numel): data/<key>, read once.
  V storage(const V& pid) {
    const auto& t = pid->items;
    if (pid->kind != Obj::kTuple || t.size() < 5 || t[0]->s != "storage" ||
        t[1]->kind != Obj::kGlobal || t[2]->kind != Obj::kStr ||
        t[4]->kind != Obj::kInt)
      fail("a persistent id that is not a torch storage");
    const std::string& key = t[2]->s;
    if (const auto it = storages_.find(key); it != storages_.end())
      return it->second;
    const StorageType* type = nullptr;
    for (const auto& s : kStorages) {
      if (t[1]->s == s.name)
        type = &s;
    }
    if (!type)  // complex, quantized: inert, refused if a weight needs it
      return make_str(Obj::kObject, t[1]->s);
    const int64_t numel = t[4]->i;
    const std::string record = "data/" + key;
    if (!zip_.has(record))
      fail("storage " + key + " has no " + record + " in the archive");
    auto [data, bytes] = zip_.get(record);
    const size_t element = c10::elementSize(type->type);
    const size_t want = static_cast<size_t>(numel) * element;
    if (numel < 0 || static_cast<size_t>(numel) > bytes / element ||
        bytes != want)
      fail(detail::concat(
          "storage ",
          key,
          " holds ",
          bytes,
          " bytes, not its ",
          numel,
          " elements of ",
          element,
          " bytes (a damaged file?)"));
    V v = make(Obj::kStorage);
    v->tensor = torch::empty({numel}, torch::TensorOptions(type->type));
    if (bytes > 0)
      std::memcpy(v->tensor.data_ptr(), data.get(), bytes);
    storages_.emplace(key, v);
    return v;
  }

  std::string path_;
  TorchZip& zip_;
  const char* p_;
  size_t size_;
  size_t pos_ = 0;
  std::vector<V> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, V> memo_;
  std::unordered_map<std::string, V> storages_;
  std::vector<std::unique_ptr<Obj>> arena_;  // owns every value
};

// A tensor, or what a rebuild function memtrain does not follow made.
bool tensor_like(const V& v) {
  return v->kind == Obj::kTensor ||
         (v->kind == Obj::kObject &&
          v->s.rfind("torch._utils._rebuild", 0) == 0);
}

// A module's extra state (get_extra_state()): none of memtrain's models has
// one, and it need not be a tensor; skipped.
bool extra_state(const std::string& name) {
  const std::string tail = "_extra_state";
  return name.size() >= tail.size() &&
         name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
}

// "" when `v` is a state dict (string keys, tensors), else why not.
std::string why_not_state_dict(const V& v) {
  if (v->kind != Obj::kDict)
    return std::string("it is ") + kind_name(*v);
  if (v->entries.empty())
    return "it is empty";
  for (const auto& [k, x] : v->entries) {
    if (k->kind != Obj::kStr)
      return std::string("a key is ") + kind_name(*k);
    if (!tensor_like(x) && !extra_state(k->s))
      return "'" + k->s + "' is " + kind_name(*x) +
             (x->kind == Obj::kObject ? " (" + x->s + ")" : "") +
             ", not a tensor";
  }
  return "";
}

// The keys under which checkpoints keep a model's state dict, in the order
// they are tried.
constexpr const char* kEntries[] = {
    "state_dict",
    "model",
    "model_state_dict",
    "module",
    "network_weights",
    "net",
};

std::string key_list(const V& dict) {
  std::string out;
  size_t n = 0;
  for (const auto& [k, x] : dict->entries) {
    if (n == 8) {
      out += ", ...";
      break;
    }
    out += (n++ ? ", " : "") + (k->kind == Obj::kStr
                                    ? "'" + k->s + "'"
                                    : std::string("(not a string)"));
  }
  return out;
}

// The legacy format's start: PROTO 2, then LONG1 of 10 bytes, the magic
// number 0x1950a86a20f9469cfc6c.
constexpr unsigned char kLegacyMagic[] = {
    0x80,
    0x02,
    0x8a,
    0x0a,
    0x6c,
    0xfc,
    0x9c,
    0x46,
    0xf9,
    0x20,
    0x6a,
    0xa8,
    0x50,
    0x19};

bool starts_with(const std::string& path, const void* magic, size_t n) {
  std::ifstream in(path, std::ios::binary);
  std::string head(n, '\0');
  return in.read(head.data(), static_cast<std::streamsize>(n)) &&
         std::memcmp(head.data(), magic, n) == 0;
}

bool is_zip_file(const std::string& path) {
  return starts_with(path, "PK\x03\x04", 4);
}

TorchWeights read(const std::string& path) {
  MT_CHECK(
      !starts_with(path, kLegacyMagic, sizeof(kLegacyMagic)),
      "'",
      path,
      "' is in PyTorch's legacy format (before PyTorch 1.6, or saved with "
      "_use_new_zipfile_serialization=False), which memtrain does not read: "
      "re-save it with python -c \"import torch; torch.save(torch.load('",
      path,
      "', weights_only=True), 'new.pt')\"");
  MT_CHECK(
      is_zip_file(path),
      "'",
      path,
      "' is neither a safetensors file nor a torch.save zip archive");
  TorchZip zip(path);
  MT_CHECK(
      !zip.has("constants.pkl"),
      "'",
      path,
      "' is a TorchScript archive (torch.jit.save), not a state dict: save "
      "model.state_dict() with torch.save");
  MT_CHECK(
      zip.has("data.pkl"),
      "'",
      path,
      "' has no data.pkl: not a torch.save archive");
  if (zip.has("byteorder")) {
    auto [order, n] = zip.get("byteorder");
    MT_CHECK(
        std::string(static_cast<const char*>(order.get()), n) == "little",
        "'",
        path,
        "' was saved on a big-endian machine: re-save it on a little-endian "
        "one");
  }
  auto [pkl, pkl_size] = zip.get("data.pkl");
  Unpickler unpickler(path, zip, static_cast<const char*>(pkl.get()), pkl_size);
  const V root = unpickler.run();

  TorchWeights out;
  V dict = nullptr;
  if (root->kind == Obj::kDict) {
    for (const char* name : kEntries) {
      for (const auto& [k, x] : root->entries) {
        if (!dict && k->kind == Obj::kStr && k->s == name &&
            x->kind == Obj::kDict) {
          const std::string why = why_not_state_dict(x);
          MT_CHECK(
              why.empty(),
              "'",
              path,
              "': its '",
              name,
              "' is not a state dict: ",
              why);
          dict = x;
          out.entry = name;
        }
      }
    }
    if (!dict) {
      const std::string why = why_not_state_dict(root);
      MT_CHECK(
          why.empty(),
          "'",
          path,
          "' holds a dict with keys ",
          key_list(root),
          " that is not a state dict (",
          why,
          "): memtrain reads a dict of tensors by name, at the top of the "
          "file or under 'state_dict', 'model', 'model_state_dict', "
          "'module', 'network_weights' or 'net'");
      dict = root;
    }
  } else {
    throw Error(
        "'" + path + "' holds " +
        (root->kind == Obj::kObject
             ? "a pickled " + root->s +
                   " (torch.save(model)?), not a state dict: save "
                   "model.state_dict() with torch.save"
             : std::string(kind_name(*root)) + ", not a dict of tensors"));
  }
  for (const auto& [k, x] : dict->entries) {
    if (x->kind != Obj::kTensor && extra_state(k->s))
      continue;
    MT_CHECK(
        x->kind == Obj::kTensor,
        "'",
        path,
        "': tensor '",
        k->s,
        "' is made by ",
        x->s,
        " (a quantized, complex, sparse or conjugated tensor, or one of a "
        "dtype memtrain does not hold: uint16-64, float8), which memtrain "
        "cannot load: save a dense float, integer or bool one");
    out.tensors.emplace_back(k->s, x->tensor);
  }
  return out;
}

}  // namespace

bool is_torch_file(const std::string& path) {
  return is_zip_file(path) ||
         starts_with(path, kLegacyMagic, sizeof(kLegacyMagic));
}

TorchWeights load_torch_weights(const std::string& path) {
  MT_CHECK(std::ifstream(path).good(), "cannot open '", path, "'");
  try {
    return read(path);
  } catch (const c10::Error& e) {  // the zip reader, a tensor op
    throw Error(
        "'" + path + "' is not a torch.save file memtrain can read: " +
        e.what_without_backtrace());
  } catch (const std::bad_alloc&) {
    throw Error(
        "'" + path +
        "': out of host memory while reading it (a damaged file whose "
        "sizes are wrong?)");
  }
}

}  // namespace memtrain
