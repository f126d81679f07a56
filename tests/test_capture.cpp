// Captured problems (testing/capture.hpp): the .npy reader against the writer and against bad files,
// and a captured layer run by the CPU plan against the oracle, as `twell bench --from` runs it.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "capture.hpp"
#include "harness.hpp"   // bench/: the inference suite over captured layers
#include "training.hpp"  // bench/: the training suite over captured layers
#include "common.hpp"

namespace twell::test {
namespace {

// A fresh folder under the system's temporary directory, removed with its files at the end.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/twell-capture-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() { std::system(("rm -rf '" + path_ + "'").c_str()); }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

testing::NpyArray random_array(DType t, int64_t rows, int64_t cols, uint64_t s) {
  testing::NpyArray a;
  a.dtype = t;
  a.rows = rows;
  a.cols = cols;
  a.bytes.resize(size_t(rows * cols) * dtype_size(t));
  std::mt19937_64 rng(s);
  for (auto& b : a.bytes) b = uint8_t(rng());
  return a;
}

TEST(Capture, NpyRoundTripsEveryDtype) {
  TempDir d;
  for (DType t : {DType::f32, DType::f16, DType::bf16})
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{3, 5}, {1, 1}, {0, 7}, {17, 64}}) {
      const testing::NpyArray a = random_array(t, rows, cols, seed(uint64_t(rows * 100 + cols)));
      testing::write_npy(d.file("a.npy"), a);
      const testing::NpyArray b = testing::read_npy(d.file("a.npy"));
      EXPECT_EQ(b.dtype, t);
      EXPECT_EQ(b.rows, rows);
      EXPECT_EQ(b.cols, cols);
      EXPECT_EQ(b.bytes, a.bytes) << dtype_name(t) << " " << rows << "x" << cols;
    }
}

// A header as NumPy writes it (format 1.0), with the given dict and then `data_bytes` bytes.
void write_raw(const std::string& path, const std::string& dict, size_t data_bytes, const char* magic = "\x93NUMPY") {
  std::string header = dict;
  header.append((64 - (10 + header.size() + 1) % 64) % 64, ' ');
  header += '\n';
  std::ofstream f(path, std::ios::binary);
  f.write(magic, 6);
  f.put(1);
  f.put(0);
  f.put(char(header.size() & 0xff));
  f.put(char(header.size() >> 8));
  f << header << std::string(data_bytes, '\0');
}

TEST(Capture, BadFilesRaiseNamingTheFile) {
  TempDir d;
  const std::string p = d.file("bad.npy");
  auto expect_raises = [&](const std::string& what) {
    try {
      testing::read_npy(p);
      ADD_FAILURE() << what << ": no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("bad.npy"), std::string::npos) << what << ": " << e.what();
    }
  };
  struct Bad {
    const char* what;
    std::string dict;
    size_t data_bytes;
    const char* magic;
  };
  const std::string f4 = "{'descr': '<f4', 'fortran_order': False, 'shape': ";
  const Bad cases[] = {
      {"bad magic", f4 + "(2, 3), }", 24, "\x93NUMPX"},
      {"float64", "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }", 48, "\x93NUMPY"},
      {"big-endian", "{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }", 24, "\x93NUMPY"},
      {"Fortran order", "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", 24, "\x93NUMPY"},
      {"3-D", f4 + "(2, 3, 4), }", 96, "\x93NUMPY"},
      {"1-D", f4 + "(6,), }", 24, "\x93NUMPY"},
      {"truncated data", f4 + "(2, 3), }", 23, "\x93NUMPY"},
      {"overflowing shape", f4 + "(4611686018427387904, 4), }", 0, "\x93NUMPY"},
  };
  for (const Bad& c : cases) {
    write_raw(p, c.dict, c.data_bytes, c.magic);
    expect_raises(c.what);
  }
  std::ofstream(p, std::ios::binary) << "\x93NUMPY";
  expect_raises("truncated header");
  EXPECT_THROW(testing::read_npy(d.file("missing.npy")), Error);
  EXPECT_THROW(testing::captured_layers(d.path()), Error);  // no layer0.x.npy
}

// Writes layer i of a capture from a generated problem (x, and the weights as the capture lays
// them out: down is already neuron-major in a Problem).
void write_layer(const TempDir& d, int i, testing::Problem& p) {
  auto arr = [&](const std::vector<uint8_t>& bytes, int64_t rows, int64_t cols) {
    testing::NpyArray a;
    a.dtype = p.spec.dtype;
    a.rows = rows;
    a.cols = cols;
    a.bytes = bytes;
    return a;
  };
  const std::string base = d.file("layer" + std::to_string(i) + ".");
  testing::write_npy(base + "x.npy", arr(p.x, p.spec.m, p.spec.k));
  if (p.spec.kind == FfnKind::gated) testing::write_npy(base + "gate.npy", arr(p.gate, p.spec.n, p.spec.k));
  testing::write_npy(base + "up.npy", arr(p.up, p.spec.n, p.spec.k));
  testing::write_npy(base + "down.npy", arr(p.down, p.spec.n, p.spec.k));
}

TEST(Capture, LayersLoadAndRunExactlyOnTheCpu) {
  TempDir d;
  std::vector<testing::Problem> made;
  int i = 0;
  for (FfnKind kind : {FfnKind::gated, FfnKind::plain})
    for (DType t : {DType::f32, DType::bf16}) {
      made.push_back(testing::make_problem({kind, 37, 64, 300, t, Pattern::heavy_tailed, 0.02, 64, seed(700 + i)}));
      write_layer(d, i++, made.back());
    }
  ASSERT_EQ(testing::captured_layers(d.path()), i);
  for (int l = 0; l < i; ++l) {
    testing::Problem p = testing::load_captured_layer(d.path(), l);
    const testing::Problem& want = made[size_t(l)];
    EXPECT_EQ(p.spec.kind, want.spec.kind);
    EXPECT_EQ(p.spec.dtype, want.spec.dtype);
    EXPECT_EQ(p.spec.pattern, Pattern::captured);
    EXPECT_EQ(p.spec.m, want.spec.m);
    EXPECT_EQ(p.x, want.x);
    EXPECT_EQ(p.gate, want.gate);
    EXPECT_EQ(p.up, want.up);
    EXPECT_EQ(p.down, want.down);
    InferencePlan plan(p.weights());
    std::vector<uint8_t> y(p.x.size());
    poison(y.data(), y.size());
    plan.run({p.x_view(), TensorView::matrix(y.data(), p.spec.dtype, p.spec.m, p.spec.k)});
    const testing::ForwardCheck c = testing::check_forward(p, y.data());
    EXPECT_TRUE(c.ok()) << "layer " << l << ": error " << c.error << " tolerance " << c.tolerance;

    const testing::Problem cut = testing::load_captured_layer(d.path(), l, 5);  // the first 5 rows
    EXPECT_EQ(cut.spec.m, 5);
    EXPECT_EQ(cut.x, std::vector<uint8_t>(want.x.begin(), want.x.begin() + std::ptrdiff_t(cut.x.size())));
  }
}

// `twell bench --from DIR` on the CPU, one warm-up and one timed run per layer.
bench::Options captured_suite(const std::string& suite, const TempDir& d) {
  bench::Options o;
  o.suite = suite;
  o.backend = "cpu";
  o.from_dir = d.path();
  o.warmup = 1;
  o.reps = 1;
  return o;
}

// `twell bench --from` times a training step per captured layer: the rows name their layer, carry
// the capture's density, and twell's step agrees with the dense one.
TEST(Capture, TrainingSuiteRunsEveryLayer) {
  TempDir d;
  std::vector<testing::Problem> made;
  for (int i = 0; i < 2; ++i) {
    made.push_back(testing::make_problem({FfnKind::gated, 40 + i, 64, 300, DType::f32, Pattern::heavy_tailed,
                                          0.02, 64, seed(720 + i)}));
    write_layer(d, i, made.back());
  }
  std::ofstream(d.path() + "/manifest.json") << "{\"checkpoint\": \"c.pt\", \"max_row_active\": [3, 4]}";
  bench::Options o = captured_suite("real_training", d);
  std::ostringstream progress;
  std::vector<std::string> errors;
  const auto rows = bench::run_training(o, progress, &errors);
  ASSERT_TRUE(errors.empty()) << errors.front();
  ASSERT_EQ(rows.size(), 2u);
  for (size_t i = 0; i < rows.size(); ++i) {
    const bench::TrainingRow& r = rows[i];
    EXPECT_EQ(r.source, d.path() + " layer " + std::to_string(i));
    EXPECT_EQ(r.spec.pattern, Pattern::captured);
    EXPECT_EQ(r.spec.m, made[i].spec.m);
    EXPECT_GT(r.density, 0);
    EXPECT_EQ(r.spec.density, r.density);
    EXPECT_TRUE(r.ok()) << "layer " << i << ": twell vs dense " << r.grad_rel_diff;
    EXPECT_EQ(r.model, ", \"checkpoint\": \"c.pt\", \"checkpoint_l1_coef\": null, \"train_log\": null, "
                       "\"max_row_active\": " + std::to_string(3 + i));
  }
  o.from_rows = 7;  // the first 7 rows of each layer
  const auto cut = bench::run_training(o, progress);
  ASSERT_EQ(cut.size(), 2u);
  EXPECT_EQ(cut[1].spec.m, 7);
}

// `twell bench --from` times inference per captured layer (the suite named "real" by the CLI):
// a row per layer, naming it, within the oracle's tolerance.
TEST(Capture, InferenceSuiteRunsEveryLayer) {
  TempDir d;
  for (int i = 0; i < 2; ++i) {
    testing::Problem p = testing::make_problem({FfnKind::gated, 30 + i, 64, 300, DType::f32, Pattern::heavy_tailed,
                                                0.02, 64, seed(730 + i)});
    write_layer(d, i, p);
  }
  const bench::Options o = captured_suite("real", d);
  std::ostringstream progress;
  const std::vector<bench::Row> rows = bench::run(o, progress);
  ASSERT_EQ(rows.size(), 2u);
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i].source, d.path() + " layer " + std::to_string(i));
    EXPECT_EQ(rows[i].spec.m, 30 + int64_t(i));
    EXPECT_GE(rows[i].tolerance, 0) << "layer " << i << ": error " << rows[i].error;
    EXPECT_EQ(rows[i].model, "") << "no manifest.json: nothing to name";
  }
}

// The rows name the model behind a capture as its manifest.json does: the checkpoint, its L1
// coefficient and log, and each layer's densest token (values copied as written; null where the
// manifest has none or the layer is past its list).
TEST(Capture, RowsNameTheModelOfTheManifest) {
  TempDir d;
  EXPECT_EQ(testing::capture_model_fields(d.path(), 0), "");
  {
    std::ofstream f(d.path() + "/manifest.json");
    f << "{\n \"format\": \"twell-capture-1\",\n \"checkpoint\": \"/runs/a \\\"b\\\"/checkpoint.pt\",\n"
         " \"l1_coef\": 0.0003,\n \"train_log\": null,\n \"modules\": [\n  \"m.0\",\n  \"m.1\"\n ],\n"
         " \"max_row_active\": [\n  57,\n  1204\n ]\n}\n";
  }
  const std::string common = ", \"checkpoint\": \"/runs/a \\\"b\\\"/checkpoint.pt\", \"checkpoint_l1_coef\": 0.0003, "
                              "\"train_log\": null, \"max_row_active\": ";
  EXPECT_EQ(testing::capture_model_fields(d.path(), 0), common + "57");
  EXPECT_EQ(testing::capture_model_fields(d.path(), 1), common + "1204");
  EXPECT_EQ(testing::capture_model_fields(d.path(), 2), common + "null");
  {
    std::ofstream f(d.path() + "/manifest.json");
    f << "{\"format\": \"twell-capture-1\", \"l1_coef\": null}";
  }
  EXPECT_EQ(testing::capture_model_fields(d.path(), 0),
            ", \"checkpoint\": null, \"checkpoint_l1_coef\": null, \"train_log\": null, \"max_row_active\": null");
}

TEST(Capture, MismatchedLayerFilesRaise) {
  TempDir d;
  testing::Problem p = testing::make_problem({FfnKind::gated, 4, 64, 128, DType::f32, Pattern::uniform, 0.05, 64, 1});
  write_layer(d, 0, p);
  testing::write_npy(d.file("layer0.down.npy"), random_array(DType::f32, 127, 64, 2));  // N mismatch
  EXPECT_THROW(testing::load_captured_layer(d.path(), 0), Error);
  write_layer(d, 0, p);
  testing::write_npy(d.file("layer0.up.npy"), random_array(DType::bf16, 128, 64, 3));  // dtype mismatch
  EXPECT_THROW(testing::load_captured_layer(d.path(), 0), Error);
  write_layer(d, 0, p);
  std::remove(d.file("layer0.up.npy").c_str());  // a layer without its up weight
  EXPECT_THROW(testing::load_captured_layer(d.path(), 0), Error);
  EXPECT_THROW(testing::make_problem({FfnKind::gated, 4, 64, 128, DType::f32, Pattern::captured, 0.05, 64, 1}),
               Error);
}

}  // namespace
}  // namespace twell::test
