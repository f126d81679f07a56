#include "capture.hpp"

#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>

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

// The value of `key` in the header's dict ("'key': value"), up to the next ',' or '}' outside
// parentheses; "" when absent.
std::string header_value(const std::string& h, const std::string& key) {
  const size_t at = h.find("'" + key + "'");
  if (at == std::string::npos) return "";
  size_t i = h.find(':', at);
  if (i == std::string::npos) return "";
  ++i;
  while (i < h.size() && h[i] == ' ') ++i;
  int depth = 0;
  size_t end = i;
  for (; end < h.size(); ++end) {
    if (h[end] == '(') ++depth;
    if (h[end] == ')') --depth;
    if (depth == 0 && (h[end] == ',' || h[end] == '}')) break;
  }
  return h.substr(i, end - i);
}

// "(3, 4)" -> {3, 4}; anything but two non-negative integers -> false.
bool parse_shape(const std::string& s, int64_t& rows, int64_t& cols) {
  if (s.size() < 2 || s.front() != '(' || s.back() != ')') return false;
  std::vector<int64_t> dims;
  std::string cur;
  for (size_t i = 1; i + 1 <= s.size(); ++i) {
    const char c = i + 1 == s.size() ? ',' : s[i];
    if (c >= '0' && c <= '9') {
      if (cur.size() > 15) return false;
      cur += c;
    } else if (c == ',') {
      if (!cur.empty()) dims.push_back(std::stoll(cur));
      cur.clear();
    } else if (c != ' ' && c != 'L') {
      return false;
    }
  }
  if (dims.size() != 2) return false;
  rows = dims[0];
  cols = dims[1];
  return true;
}

std::string layer_file(const std::string& dir, int layer, const char* what) {
  return dir + "/layer" + std::to_string(layer) + "." + what + ".npy";
}

bool exists(const std::string& path) { return std::ifstream(path).good(); }

}  // namespace

NpyArray read_npy(const std::string& path) {
  const char* op = "read_npy";
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(op, "file", "a readable .npy file", path);
  char magic[kMagicBytes + 2] = {};
  if (!f.read(magic, sizeof magic) || std::memcmp(magic, kMagic, kMagicBytes) != 0)
    throw Error(op, path, "the .npy magic \\x93NUMPY", "other bytes");
  const int major = uint8_t(magic[6]);
  if (major < 1 || major > 3) throw Error(op, path, ".npy format 1.0 to 3.0", std::to_string(major) + ".x");
  uint32_t header_bytes = 0;
  unsigned char len[4] = {};
  if (!f.read(reinterpret_cast<char*>(len), major == 1 ? 2 : 4)) throw Error(op, path, "a header length", "end of file");
  header_bytes = major == 1 ? uint32_t(len[0] | len[1] << 8) : uint32_t(len[0] | len[1] << 8 | len[2] << 16 | len[3] << 24);
  if (header_bytes > (1u << 20)) throw Error(op, path, "a header under 1 MiB", std::to_string(header_bytes) + " bytes");
  std::string header(header_bytes, '\0');
  if (!f.read(&header[0], header_bytes)) throw Error(op, path, "the whole header", "end of file");

  NpyArray a;
  const std::string descr = header_value(header, "descr");
  if (descr == "'<f4'") a.dtype = DType::f32;
  else if (descr == "'<f2'") a.dtype = DType::f16;
  else if (descr == "'<u2'") a.dtype = DType::bf16;
  else throw Error(op, path, "dtype '<f4' (float32), '<f2' (float16) or '<u2' (bfloat16 bits)", descr);
  if (header_value(header, "fortran_order") != "False")
    throw Error(op, path, "C order (fortran_order False)", header_value(header, "fortran_order"));
  if (!parse_shape(header_value(header, "shape"), a.rows, a.cols))
    throw Error(op, path, "a 2-D shape", header_value(header, "shape"));
  const size_t es = dtype_size(a.dtype);
  if (a.cols != 0 && uint64_t(a.rows) > std::numeric_limits<uint64_t>::max() / 4 / uint64_t(a.cols))
    throw Error(op, path, "a shape whose bytes fit in 64 bits", header_value(header, "shape"));
  const uint64_t want = uint64_t(a.rows) * uint64_t(a.cols) * es;
  const std::streampos data_at = f.tellg();
  f.seekg(0, std::ios::end);
  const uint64_t have = uint64_t(f.tellg() - data_at);
  if (have < want)
    throw Error(op, path, std::to_string(want) + " data bytes for its shape", std::to_string(have));
  f.seekg(data_at);
  a.bytes.resize(size_t(want));
  if (want > 0 && !f.read(reinterpret_cast<char*>(a.bytes.data()), std::streamsize(want)))
    throw Error(op, path, std::to_string(want) + " readable data bytes", "a read error");
  return a;
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

// The JSON value of a top-level `key` in `doc` as written (a string with its quotes, a number,
// null, or an array with its brackets); "null" where the key is absent. Enough for the manifest
// python -m twell.capture writes (no nesting inside the values read).
std::string json_member(const std::string& doc, const std::string& key) {
  const std::string quoted = "\"" + key + "\"";
  size_t at = doc.find(quoted);
  if (at == std::string::npos) return "null";
  at = doc.find(':', at + quoted.size());
  if (at == std::string::npos) return "null";
  at = doc.find_first_not_of(" \t\r\n", at + 1);
  if (at == std::string::npos) return "null";
  size_t end = at;
  if (doc[at] == '"') {
    for (end = at + 1; end < doc.size() && doc[end] != '"'; ++end)
      if (doc[end] == '\\') ++end;
    return doc.substr(at, end + 1 - at);
  }
  if (doc[at] == '[') {
    end = doc.find(']', at);
    return end == std::string::npos ? "null" : doc.substr(at, end + 1 - at);
  }
  end = doc.find_first_of(",}\r\n", at);
  std::string v = doc.substr(at, end == std::string::npos ? std::string::npos : end - at);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.pop_back();
  return v.empty() ? "null" : v;
}

// Element i of a flat JSON array as written ("null" past its end or for anything else).
std::string json_item(const std::string& array, int i) {
  if (array.size() < 2 || array.front() != '[') return "null";
  size_t at = 1;
  for (int k = 0; k < i; ++k) {
    at = array.find(',', at);
    if (at == std::string::npos) return "null";
    ++at;
  }
  size_t end = array.find_first_of(",]", at);
  std::string v = array.substr(at, end - at);
  const size_t a = v.find_first_not_of(" \t\r\n"), b = v.find_last_not_of(" \t\r\n");
  return a == std::string::npos ? "null" : v.substr(a, b + 1 - a);
}

}  // namespace

std::string capture_model_fields(const std::string& dir, int layer) {
  std::ifstream f(dir + "/manifest.json");
  if (!f) return "";
  const std::string doc((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return ", \"checkpoint\": " + json_member(doc, "checkpoint") + ", \"checkpoint_l1_coef\": " +
         json_member(doc, "l1_coef") + ", \"train_log\": " + json_member(doc, "train_log") +
         ", \"max_row_active\": " + json_item(json_member(doc, "max_row_active"), layer);
}

int captured_layers(const std::string& dir) {
  int n = 0;
  while (exists(layer_file(dir, n, "x"))) ++n;
  if (n == 0)
    throw Error("load_capture", "folder", "layer0.x.npy and the other files of `python -m twell.capture`",
                dir + " holds no layer0.x.npy");
  return n;
}

Problem load_captured_layer(const std::string& dir, int layer, int64_t max_rows) {
  const char* op = "load_capture";
  NpyArray x = read_npy(layer_file(dir, layer, "x"));
  NpyArray up = read_npy(layer_file(dir, layer, "up"));
  NpyArray down = read_npy(layer_file(dir, layer, "down"));
  const std::string gate_path = layer_file(dir, layer, "gate");
  const bool gated = exists(gate_path);
  NpyArray gate = gated ? read_npy(gate_path) : NpyArray{};
  for (const NpyArray* w : {&up, &down, gated ? &gate : &up}) {
    if (w->dtype != x.dtype)
      throw Error(op, "layer " + std::to_string(layer) + " weights", std::string("dtype ") + dtype_name(x.dtype) + " as x",
                  dtype_name(w->dtype));
    if (w->rows != up.rows || w->cols != x.cols)
      throw Error(op, "layer " + std::to_string(layer) + " weights",
                  "[N, K] = [" + std::to_string(up.rows) + ", " + std::to_string(x.cols) + "] each (down transposed)",
                  "[" + std::to_string(w->rows) + ", " + std::to_string(w->cols) + "]");
  }
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
