#include "capture.hpp"

#include <cstring>
#include <fstream>
#include <limits>
#include <new>
#include <string>

#include "input_file.hpp"
#include "twell/error.hpp"

namespace twell::testing {

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicBytes = 6;

const char* descr_of(DType t) {
  if (t == DType::f32) return "<f4";
  if (t == DType::f16) return "<f2";
  if (t == DType::bf16) return "<u2";
  throw Error("write_npy", "dtype", "float32, float16 or bfloat16", dtype_name(t));
}

// The values of an .npy header's dict as written, each the text after its ':' (spaces skipped) up
// to the next ',' or '}' outside parentheses.
struct HeaderDict {
  std::string descr, fortran_order, shape;
};

// The header's dict: '{', the keys 'descr', 'fortran_order' and 'shape' (single-quoted, as NumPy
// writes them; any order; exactly these, as NumPy's reader wants), each once, '}', then only the
// padding (spaces and the final newline). Error naming the file otherwise: a second 'shape' was
// read as the first one said.
HeaderDict parse_header_dict(const std::string& h, const std::string& path) {
  static const char* const kKeys[] = {"descr", "fortran_order", "shape"};
  const auto refuse = [&path](const std::string& got) {
    return Error("read_npy", path, "a header dict of 'descr', 'fortran_order' and 'shape', each once", got);
  };
  HeaderDict d;
  std::string* const values[] = {&d.descr, &d.fortran_order, &d.shape};
  bool seen[3] = {};
  size_t i = 0;
  const auto spaces = [&] {
    while (i < h.size() && h[i] == ' ') ++i;
  };
  spaces();
  if (i >= h.size() || h[i] != '{') throw refuse("no '{' at its start");
  ++i;
  while (true) {
    spaces();
    if (i < h.size() && h[i] == '}') break;
    const size_t close = i < h.size() && h[i] == '\'' ? h.find('\'', i + 1) : std::string::npos;
    if (close == std::string::npos) throw refuse("no quoted key or '}' at byte " + std::to_string(i));
    const std::string key = h.substr(i + 1, close - i - 1);
    i = close + 1;
    int k = 0;
    while (k < 3 && key != kKeys[k]) ++k;
    if (k == 3) throw refuse("key '" + key.substr(0, 40) + (key.size() > 40 ? "...'" : "'"));
    if (seen[k]) throw refuse("'" + key + "' again");
    seen[k] = true;
    spaces();
    if (i >= h.size() || h[i] != ':') throw refuse("no ':' after '" + key + "'");
    ++i;
    spaces();
    const size_t begin = i;
    for (int depth = 0; i < h.size(); ++i) {
      if (h[i] == '(') ++depth;
      if (h[i] == ')') --depth;
      if (depth == 0 && (h[i] == ',' || h[i] == '}')) break;
    }
    *values[k] = h.substr(begin, i - begin);
    if (i >= h.size()) throw refuse("no ',' or '}' after '" + key + "'");
    if (h[i] == ',') ++i;
  }
  ++i;  // the '}'
  while (i < h.size() && (h[i] == ' ' || h[i] == '\n')) ++i;
  if (i != h.size()) throw refuse("text after the dict");
  for (int k = 0; k < 3; ++k)
    if (!seen[k]) throw refuse(std::string("no '") + kKeys[k] + "'");
  return d;
}

// "(3, 4)" -> {3, 4}: a Python tuple of two non-negative integers (spaces around each, a trailing
// comma, an L suffix as Python 2 wrote longs); anything else, a space inside a number among it,
// -> false.
bool parse_shape(const std::string& s, int64_t& rows, int64_t& cols) {
  if (s.size() < 2 || s.front() != '(' || s.back() != ')') return false;
  std::vector<int64_t> dims;
  size_t i = 1;
  const size_t end = s.size() - 1;
  auto skip_spaces = [&] {
    while (i < end && s[i] == ' ') ++i;
  };
  while (true) {
    skip_spaces();
    if (i == end) break;  // "()" or a trailing comma
    std::string digits;
    while (i < end && s[i] >= '0' && s[i] <= '9') digits += s[i++];
    if (digits.empty() || digits.size() > 15) return false;
    dims.push_back(std::stoll(digits));
    if (i < end && s[i] == 'L') ++i;
    skip_spaces();
    if (i == end) break;
    if (s[i] != ',') return false;  // "3 4": a space inside a number is no separator
    ++i;
  }
  if (dims.size() != 2) return false;
  rows = dims[0];
  cols = dims[1];
  return true;
}

std::string layer_file(const std::string& dir, int layer, const char* what) {
  return dir + "/layer" + std::to_string(layer) + "." + what + ".npy";
}

// An .npy file's header: its dtype and 2-D shape; `file` is left at the first data byte.
NpyArray read_npy_header(InputFile& f, const std::string& path) {
  const char* op = "read_npy";
  char magic[kMagicBytes + 2] = {};
  if (!f.read(magic, sizeof magic) || std::memcmp(magic, kMagic, kMagicBytes) != 0)
    throw Error(op, path, "the .npy magic \\x93NUMPY", "other bytes");
  const int major = uint8_t(magic[6]);
  if (major < 1 || major > 3) throw Error(op, path, ".npy format 1.0 to 3.0", std::to_string(major) + ".x");
  unsigned char len[4] = {};
  if (!f.read(len, major == 1 ? 2 : 4)) throw Error(op, path, "a header length", "end of file");
  const uint32_t header_bytes =
      major == 1 ? uint32_t(len[0] | len[1] << 8) : uint32_t(len[0] | len[1] << 8 | len[2] << 16 | uint32_t(len[3]) << 24);
  if (header_bytes > (1u << 20)) throw Error(op, path, "a header under 1 MiB", std::to_string(header_bytes) + " bytes");
  std::string header(header_bytes, '\0');
  if (header_bytes > 0 && !f.read(&header[0], header_bytes)) throw Error(op, path, "the whole header", "end of file");

  NpyArray a;
  const HeaderDict dict = parse_header_dict(header, path);
  if (dict.descr == "'<f4'") a.dtype = DType::f32;
  else if (dict.descr == "'<f2'") a.dtype = DType::f16;
  else if (dict.descr == "'<u2'") a.dtype = DType::bf16;
  else throw Error(op, path, "dtype '<f4' (float32), '<f2' (float16) or '<u2' (bfloat16 bits)", dict.descr);
  if (dict.fortran_order != "False") throw Error(op, path, "C order (fortran_order False)", dict.fortran_order);
  if (!parse_shape(dict.shape, a.rows, a.cols))
    throw Error(op, path, "a 2-D shape (two non-negative integers)", dict.shape);
  const size_t es = dtype_size(a.dtype);
  if (a.cols != 0 && uint64_t(a.rows) > std::numeric_limits<uint64_t>::max() / 4 / uint64_t(a.cols))
    throw Error(op, path, "a shape whose bytes fit in 64 bits", dict.shape);
  const uint64_t want = uint64_t(a.rows) * uint64_t(a.cols) * es;
  const uint64_t have = f.size() - f.offset();
  if (have < want) throw Error(op, path, std::to_string(want) + " data bytes for its shape", std::to_string(have));
  return a;
}

}  // namespace

NpyArray read_npy(const std::string& path) {
  InputFile f(path, "read_npy");
  NpyArray a = read_npy_header(f, path);
  const uint64_t want = uint64_t(a.rows) * uint64_t(a.cols) * dtype_size(a.dtype);
  try {
    a.bytes.resize(size_t(want));
  } catch (const std::bad_alloc&) {
    throw Error("read_npy", path, "memory for its " + std::to_string(want) + " data bytes", "allocation failed");
  }
  if (want > 0 && !f.read(a.bytes.data(), want))
    throw Error("read_npy", path, std::to_string(want) + " readable data bytes", "a read error");
  return a;
}

NpyArray read_npy_shape(const std::string& path) {
  InputFile f(path, "read_npy");
  return read_npy_header(f, path);
}

void write_npy(const std::string& path, const NpyArray& a) {
  std::string header = std::string("{'descr': '") + descr_of(a.dtype) + "', 'fortran_order': False, 'shape': (" +
                       std::to_string(a.rows) + ", " + std::to_string(a.cols) + "), }";
  const size_t unpadded = kMagicBytes + 2 + 2 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  std::ofstream f(path, std::ios::binary);
  if (!f) throw Error("write_npy", "file", "a writable path", path);
  f.write(kMagic, kMagicBytes);
  const char version[2] = {1, 0};
  f.write(version, 2);
  const unsigned char len[2] = {uint8_t(header.size() & 0xff), uint8_t(header.size() >> 8)};
  f.write(reinterpret_cast<const char*>(len), 2);
  f << header;
  f.write(reinterpret_cast<const char*>(a.bytes.data()), std::streamsize(a.bytes.size()));
  if (!f) throw Error("write_npy", "file", "a complete write", path);
}

namespace {

// Layer i's headers (or whole arrays) against each other: x [M >= 1, K >= 1], the weights [N >= 1,
// K] each (down transposed), one dtype.
void check_layer(int layer, const NpyArray& x, const NpyArray& up, const NpyArray& down, const NpyArray* gate) {
  const char* op = "load_capture";
  const std::string name = "layer " + std::to_string(layer);
  auto shape = [](const NpyArray& a) { return "[" + std::to_string(a.rows) + ", " + std::to_string(a.cols) + "]"; };
  if (x.rows < 1 || x.cols < 1) throw Error(op, name + " x", "[M, K] with at least one row and column", shape(x));
  for (const NpyArray* w : {&up, &down, gate}) {
    if (w == nullptr) continue;
    if (w->dtype != x.dtype)
      throw Error(op, name + " weights", std::string("dtype ") + dtype_name(x.dtype) + " as x", dtype_name(w->dtype));
    if (w->rows != up.rows || w->cols != x.cols || up.rows < 1)
      throw Error(op, name + " weights",
                  "[N, K] = [" + std::to_string(up.rows) + ", " + std::to_string(x.cols) +
                      "] each, N >= 1 (down transposed)",
                  shape(*w));
  }
}

// Whether layer i has a gate weight: a file of that name is there (anything else there than a
// regular file, a link to nothing included, is refused when read).
bool has_gate(const std::string& dir, int layer) {
  return path_kind(layer_file(dir, layer, "gate")) != PathKind::missing;
}

// manifest.json of a capture as a JSON object; null when the folder has none.
Json read_manifest(const std::string& dir) {
  const char* op = "load_capture";
  const std::string path = dir + "/manifest.json";
  if (path_kind(path) == PathKind::missing) return Json();
  constexpr uint64_t kMaxManifest = uint64_t(16) << 20;  // python -m twell.capture writes a few KB
  constexpr size_t kMaxManifestValues = size_t(1) << 16;  // and a few values per layer
  InputFile f(path, op);
  const Json doc = parse_json(f.read_rest(kMaxManifest), op, path, kMaxManifestValues);
  if (doc.kind() != Json::Kind::object) throw Error(op, path, "a JSON object", "another JSON value");
  return doc;
}

}  // namespace

Json capture_model(const Json& manifest, int layer) {
  Json model = Json::object();
  if (manifest.is_null()) return model;
  model.set("checkpoint", manifest["checkpoint"]);
  model.set("checkpoint_l1_coef", manifest["l1_coef"]);
  model.set("train_log", manifest["train_log"]);
  model.set("max_row_active", manifest["max_row_active"][size_t(layer)]);
  return model;
}

Json capture_model(const std::string& dir, int layer) { return capture_model(read_manifest(dir), layer); }

CaptureFolder read_capture(const std::string& dir) {
  const char* op = "load_capture";
  const std::string want = "a folder of `python -m twell.capture` (layer0.x.npy, ...)";
  const PathKind kind = path_kind(dir);
  if (kind != PathKind::directory)
    throw Error(op, "folder", want, dir + (kind == PathKind::missing ? " does not exist" : " is not a folder"));
  CaptureFolder c;
  int& n = c.layers;
  while (path_kind(layer_file(dir, n, "x")) != PathKind::missing) ++n;  // a dangling link counts: refused below
  if (n == 0) throw Error(op, "folder", want, dir + " holds no layer0.x.npy");
  for (int i = 0; i < n; ++i) {  // every header, before any layer runs
    const NpyArray x = read_npy_shape(layer_file(dir, i, "x"));
    const NpyArray up = read_npy_shape(layer_file(dir, i, "up"));
    const NpyArray down = read_npy_shape(layer_file(dir, i, "down"));
    const bool gated = has_gate(dir, i);
    const NpyArray gate = gated ? read_npy_shape(layer_file(dir, i, "gate")) : NpyArray{};
    check_layer(i, x, up, down, gated ? &gate : nullptr);
  }
  c.manifest = read_manifest(dir);
  return c;
}

int captured_layers(const std::string& dir) { return read_capture(dir).layers; }

Problem load_captured_layer(const std::string& dir, int layer, int64_t max_rows) {
  NpyArray x = read_npy(layer_file(dir, layer, "x"));
  NpyArray up = read_npy(layer_file(dir, layer, "up"));
  NpyArray down = read_npy(layer_file(dir, layer, "down"));
  const bool gated = has_gate(dir, layer);
  NpyArray gate = gated ? read_npy(layer_file(dir, layer, "gate")) : NpyArray{};
  check_layer(layer, x, up, down, gated ? &gate : nullptr);
  const int64_t rows = max_rows > 0 && max_rows < x.rows ? max_rows : x.rows;
  x.bytes.resize(size_t(rows * x.cols) * dtype_size(x.dtype));
  Problem p;
  p.spec.kind = gated ? FfnKind::gated : FfnKind::plain;
  p.spec.m = rows;
  p.spec.k = x.cols;
  p.spec.n = up.rows;
  p.spec.dtype = x.dtype;
  p.spec.pattern = Pattern::captured;
  p.spec.density = 0;
  p.spec.seed = uint64_t(layer);
  p.x = std::move(x.bytes);
  p.gate = std::move(gate.bytes);
  p.up = std::move(up.bytes);
  p.down = std::move(down.bytes);
  return p;
}

}  // namespace twell::testing
