// Captured problems (testing/capture.hpp): the .npy reader against the writer and against bad files,
// and a captured layer run by the CPU plan against the oracle, as `twell bench --from` runs it.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <future>
#include <iterator>
#include <limits>
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
    EXPECT_EQ(r.model.dump(), "{\"checkpoint\": \"c.pt\", \"checkpoint_l1_coef\": null, \"train_log\": null, "
                              "\"max_row_active\": " + std::to_string(3 + i) + "}");
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
    EXPECT_EQ(rows[i].model.dump(), "{}") << "no manifest.json: nothing to name";
  }
}

// The rows name the model behind a capture as its manifest.json does: the checkpoint, its L1
// coefficient and log, and each layer's densest token (values copied as written; null where the
// manifest has none or the layer is past its list).
TEST(Capture, RowsNameTheModelOfTheManifest) {
  TempDir d;
  EXPECT_EQ(testing::capture_model(d.path(), 0).dump(), "{}");
  {
    std::ofstream f(d.path() + "/manifest.json");
    f << "{\n \"format\": \"twell-capture-1\",\n \"checkpoint\": \"/runs/a \\\"b\\\"/checkpoint.pt\",\n"
         " \"l1_coef\": 0.0003,\n \"train_log\": null,\n \"modules\": [\n  \"m.0\",\n  \"m.1\"\n ],\n"
         " \"max_row_active\": [\n  57,\n  1204\n ]\n}\n";
  }
  const std::string common = "{\"checkpoint\": \"/runs/a \\\"b\\\"/checkpoint.pt\", \"checkpoint_l1_coef\": 0.0003, "
                             "\"train_log\": null, \"max_row_active\": ";
  EXPECT_EQ(testing::capture_model(d.path(), 0).dump(), common + "57}");
  EXPECT_EQ(testing::capture_model(d.path(), 1).dump(), common + "1204}");
  EXPECT_EQ(testing::capture_model(d.path(), 2).dump(), common + "null}");
  {
    std::ofstream f(d.path() + "/manifest.json");
    f << "{\"format\": \"twell-capture-1\", \"l1_coef\": null}";
  }
  EXPECT_EQ(testing::capture_model(d.path(), 0).dump(),
            "{\"checkpoint\": null, \"checkpoint_l1_coef\": null, \"train_log\": null, \"max_row_active\": null}");
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

// A shape with a space inside a number is no 2-D shape (it read as another one: "(2 3, 4)" as
// [23, 4]); the spacing NumPy and Python write around numbers is accepted.
TEST(Capture, NpyShapeWithASpaceInsideANumberRaises) {
  TempDir d;
  const std::string p = d.file("a.npy"), f4 = "{'descr': '<f4', 'fortran_order': False, 'shape': ";
  for (const char* shape : {"(2 3, 4)", "(2, 3 4)", "(2, 3) ", "(2,, 3)", "(, 2, 3)", "(2, -3)", "(2 , 3 4,)"}) {
    write_raw(p, f4 + shape + ", }", 23 * 4 * 4);
    try {
      const testing::NpyArray a = testing::read_npy(p);
      ADD_FAILURE() << shape << ": read as [" << a.rows << ", " << a.cols << "]";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("a.npy"), std::string::npos) << e.what();
    }
  }
  for (const char* shape : {"(2, 3)", "(2,3)", "( 2 , 3 , )", "(2L, 3L)"}) {
    write_raw(p, f4 + shape + ", }", 24);
    const testing::NpyArray a = testing::read_npy(p);
    EXPECT_EQ(a.rows, 2) << shape;
    EXPECT_EQ(a.cols, 3) << shape;
  }
}

// An .npy header is a dict of exactly the keys 'descr', 'fortran_order' and 'shape' (as NumPy's
// reader requires), each once: a second 'shape' was read as the first one said, a key NumPy does
// not know was ignored, and text after the dict's '}' was not looked at.
TEST(Capture, NpyHeaderKeysAreEachNamedOnce) {
  TempDir d;
  const std::string p = d.file("a.npy");
  const std::string descr = "'descr': '<f4', ", order = "'fortran_order': False, ", shape = "'shape': (2, 3), ";
  const std::pair<std::string, const char*> bad[] = {
      {"{" + descr + order + shape + "'shape': (4, 5), }", "'shape' again"},
      {"{" + descr + order + "'shape': (4, 5), " + shape + "}", "'shape' again"},
      {"{" + descr + descr + order + shape + "}", "'descr' again"},
      {"{" + descr + order + order + shape + "}", "'fortran_order' again"},
      {"{" + descr + order + shape + "'extra': 1, }", "'extra'"},
      {"{" + descr + order + "}", "no 'shape'"},
      {"{" + order + shape + "}", "no 'descr'"},
      {"{" + descr + order + shape + "} 'shape': (4, 5)", "after the dict"},
      {descr + order + shape, "'{'"},
      {"{" + descr + order + "'shape' (2, 3), }", "':'"},
      {"{" + descr + order + "'shape': (2, 3)", "'}'"},
  };
  for (const auto& [dict, needle] : bad) {
    write_raw(p, dict, 20 * 4 * 4);
    try {
      const testing::NpyArray a = testing::read_npy(p);
      ADD_FAILURE() << dict << ": read as [" << a.rows << ", " << a.cols << "]";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), p) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << dict << ": " << e.what();
    }
  }
  for (const std::string& dict : {"{" + descr + order + shape + "}", "{" + shape + order + descr + "}",
                                  std::string("{'descr':'<f4','fortran_order':False,'shape':(2, 3)}")}) {
    write_raw(p, dict, 24);
    const testing::NpyArray a = testing::read_npy(p);
    EXPECT_EQ(a.rows, 2) << dict;
    EXPECT_EQ(a.cols, 3) << dict;
  }
}

// Runs `read` on another thread: a read that blocks (opening a FIFO without a writer) fails the
// test after 10 s, and is then released by opening the FIFO's other end.
template <class F>
void expect_error_without_blocking(const std::string& fifo, F read, const std::string& needle) {
  auto result = std::async(std::launch::async, [&]() -> std::string {
    try {
      read();
      return "no error";
    } catch (const Error& e) {
      return e.what();
    }
  });
  if (result.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    ADD_FAILURE() << "reading a FIFO blocked";
    const int fd = ::open(fifo.c_str(), O_WRONLY);
    if (fd >= 0) ::close(fd);
  }
  const std::string what = result.get();
  EXPECT_NE(what.find(needle), std::string::npos) << what;
}

// Inputs that are not regular files (a directory, a FIFO) raise an Error naming them, at once:
// before, a FIFO hung the reader and a directory's manifest.json ended the process.
TEST(Capture, FilesThatAreNotRegularRaiseWithoutBlocking) {
  TempDir d;
  testing::Problem p = testing::make_problem({FfnKind::gated, 4, 64, 128, DType::f32, Pattern::uniform, 0.05, 64, 1});
  write_layer(d, 0, p);
  ASSERT_EQ(::mkdir(d.file("manifest.json").c_str(), 0755), 0);
  expect_named_error([&] { testing::capture_model(d.path(), 0); }, d.file("manifest.json"), "a directory");
  expect_named_error([&] { testing::captured_layers(d.path()); }, d.file("manifest.json"), "a directory");
  ASSERT_EQ(::rmdir(d.file("manifest.json").c_str()), 0);
  ASSERT_EQ(::mkfifo(d.file("manifest.json").c_str(), 0644), 0);
  expect_error_without_blocking(d.file("manifest.json"), [&] { testing::capture_model(d.path(), 0); }, "a FIFO");
  std::remove(d.file("manifest.json").c_str());
  std::remove(d.file("layer0.up.npy").c_str());
  ASSERT_EQ(::mkfifo(d.file("layer0.up.npy").c_str(), 0644), 0);
  expect_error_without_blocking(d.file("layer0.up.npy"), [&] { testing::load_captured_layer(d.path(), 0); }, "a FIFO");
  expect_error_without_blocking(d.file("layer0.up.npy"), [&] { testing::captured_layers(d.path()); }, "a FIFO");
  std::remove(d.file("layer0.up.npy").c_str());
  ASSERT_EQ(::mkdir(d.file("layer0.up.npy").c_str(), 0755), 0);
  expect_named_error([&] { testing::read_npy(d.file("layer0.up.npy")); }, d.file("layer0.up.npy"), "a directory");
  expect_named_error([&] { testing::captured_layers(d.file("layer0.x.npy")); }, "folder", "is not a folder");
  expect_named_error([&] { testing::captured_layers(d.file("nothing")); }, "folder", "does not exist");
}

// A capture file that is a symbolic link to nothing is no missing file: a dangling layer0.gate.npy
// made the layer a plain FFN, and a dangling layer1.x.npy ended the layers at one; a dangling
// manifest.json was no manifest. Each is refused naming it. A link to a regular file is read.
TEST(Capture, DanglingLinksRaiseNamingTheFile) {
  TempDir d;
  for (int i = 0; i < 2; ++i) {
    testing::Problem p = testing::make_problem({FfnKind::gated, 4, 64, 128, DType::f32, Pattern::uniform, 0.05, 64, 1});
    write_layer(d, i, p);
  }
  ASSERT_EQ(std::rename(d.file("layer0.gate.npy").c_str(), d.file("gate.npy").c_str()), 0);
  ASSERT_EQ(::symlink("gate.npy", d.file("layer0.gate.npy").c_str()), 0);  // a link to a regular file
  EXPECT_EQ(testing::captured_layers(d.path()), 2);
  EXPECT_EQ(testing::load_captured_layer(d.path(), 0).spec.kind, FfnKind::gated);
  std::remove(d.file("gate.npy").c_str());  // now a link to nothing
  const std::string gate = d.file("layer0.gate.npy");
  expect_named_error([&] { testing::captured_layers(d.path()); }, gate, "a dangling symbolic link");
  expect_named_error([&] { testing::load_captured_layer(d.path(), 0); }, gate, "a dangling symbolic link");
  std::remove(gate.c_str());
  EXPECT_EQ(testing::captured_layers(d.path()), 2);  // no gate file at all: a plain FFN
  EXPECT_EQ(testing::load_captured_layer(d.path(), 0).spec.kind, FfnKind::plain);

  const std::string x1 = d.file("layer1.x.npy");
  std::remove(x1.c_str());
  ASSERT_EQ(::symlink("nowhere.npy", x1.c_str()), 0);
  expect_named_error([&] { testing::captured_layers(d.path()); }, x1, "a dangling symbolic link");
  std::remove(x1.c_str());
  ASSERT_EQ(::symlink("layer1.x.npy", x1.c_str()), 0);  // a link to itself
  expect_named_error([&] { testing::captured_layers(d.path()); }, x1);
  std::remove(x1.c_str());
  for (const char* name : {"layer1.gate.npy", "layer1.up.npy", "layer1.down.npy"}) std::remove(d.file(name).c_str());
  EXPECT_EQ(testing::captured_layers(d.path()), 1);

  ASSERT_EQ(::symlink("nowhere.json", d.file("manifest.json").c_str()), 0);
  expect_named_error([&] { testing::captured_layers(d.path()); }, d.file("manifest.json"), "a dangling symbolic link");
  expect_named_error([&] { testing::capture_model(d.path(), 0); }, d.file("manifest.json"), "a dangling symbolic link");
}

// A manifest of many members is refused by its count of values, at once (member names were looked
// up one by one: a 1 MB manifest of 70000 names took seconds per parse, and a run parsed it per
// row); a run reads the manifest once, when it first looks at the folder.
TEST(Capture, ManifestIsBoundedAndReadOncePerRun) {
  TempDir d;
  testing::Problem p = testing::make_problem({FfnKind::gated, 4, 64, 128, DType::f32, Pattern::uniform, 0.05, 64, 1});
  write_layer(d, 0, p);
  std::string many = "{";
  for (int i = 0; i < 70000; ++i) many += (i ? ", \"k" : "\"k") + std::to_string(100000 + i) + "\": 0";
  std::ofstream(d.file("manifest.json")) << many << "}";
  expect_named_error([&] { testing::captured_layers(d.path()); }, d.file("manifest.json"), "at most 65536 values");
  expect_named_error([&] { testing::capture_model(d.path(), 0); }, d.file("manifest.json"), "at most 65536 values");

  std::ofstream(d.file("manifest.json")) << "{\"checkpoint\": \"c.pt\", \"max_row_active\": [9]}";
  const bench::Options o = captured_suite("real", d);
  const bench::Cases cases(o, {});
  ASSERT_EQ(cases.size(), 1u);
  std::ofstream(d.file("manifest.json")) << "not JSON";  // after the run read the folder
  EXPECT_EQ(cases.model(0)["checkpoint"].text(), "c.pt");
  EXPECT_EQ(cases.model(0)["max_row_active"].text(), "9");
}

// A manifest that is not JSON, or not an object, is refused naming the file.
TEST(Capture, MalformedManifestRaises) {
  TempDir d;
  testing::Problem p = testing::make_problem({FfnKind::gated, 4, 64, 128, DType::f32, Pattern::uniform, 0.05, 64, 1});
  write_layer(d, 0, p);
  for (const char* doc : {"{\"checkpoint\": \"a", "[1, 2]", "{\"a\": 1} trailing", ""}) {
    std::ofstream(d.file("manifest.json")) << doc;
    expect_named_error([&] { testing::capture_model(d.path(), 0); }, d.file("manifest.json"));
    expect_named_error([&] { testing::captured_layers(d.path()); }, d.file("manifest.json"));
  }
}

// A layer whose x has no rows is no benchmark case: refused when the folder is first read.
TEST(Capture, LayerOfNoRowsRaises) {
  TempDir d;
  testing::Problem p = testing::make_problem({FfnKind::gated, 4, 64, 128, DType::f32, Pattern::uniform, 0.05, 64, 1});
  write_layer(d, 0, p);
  testing::write_npy(d.file("layer0.x.npy"), random_array(DType::f32, 0, 64, 4));
  expect_named_error([&] { testing::captured_layers(d.path()); }, "layer 0 x", "at least one row");
  expect_named_error([&] { testing::load_captured_layer(d.path(), 0); }, "layer 0 x", "at least one row");
}

// captured_layers checks every layer's headers, so that a bad last layer stops a run before the
// first layer is timed.
TEST(Capture, EveryLayerIsCheckedUpFront) {
  TempDir d;
  for (int i = 0; i < 3; ++i) {
    testing::Problem p = testing::make_problem({FfnKind::gated, 4, 64, 128, DType::f32, Pattern::uniform, 0.05, 64, 1});
    write_layer(d, i, p);
  }
  EXPECT_EQ(testing::captured_layers(d.path()), 3);
  testing::write_npy(d.file("layer2.gate.npy"), random_array(DType::f32, 128, 63, 5));
  expect_named_error([&] { testing::captured_layers(d.path()); }, "layer 2 weights");
  write_raw(d.file("layer2.gate.npy"), "{'descr': '<f4', 'fortran_order': False, 'shape': (128, 64), }", 7);
  expect_named_error([&] { testing::captured_layers(d.path()); }, d.file("layer2.gate.npy"), "data bytes");
}

// Results of a capture whose folder name holds a newline and a quote and whose manifest holds
// quotes, a newline, backslashes, Infinity and a number past double's range, and rows with
// non-finite figures: both results files are valid JSON that reads back as the values.
TEST(Capture, ResultsFilesAreValidJsonWhateverTheyHold) {
  TempDir d;
  const std::string folder = d.file("odd \"name\"\nwith\ta newline");
  ASSERT_EQ(::mkdir(folder.c_str(), 0755), 0);
  TempDir out;
  std::vector<testing::Problem> made;
  made.push_back(testing::make_problem({FfnKind::gated, 12, 64, 300, DType::f32, Pattern::heavy_tailed, 0.02, 64,
                                        seed(740)}));
  auto arr = [&](const std::vector<uint8_t>& bytes, int64_t rows, int64_t cols) {
    testing::NpyArray a;
    a.rows = rows, a.cols = cols, a.bytes = bytes;
    return a;
  };
  const testing::Problem& p = made.back();
  testing::write_npy(folder + "/layer0.x.npy", arr(p.x, 12, 64));
  testing::write_npy(folder + "/layer0.gate.npy", arr(p.gate, 300, 64));
  testing::write_npy(folder + "/layer0.up.npy", arr(p.up, 300, 64));
  testing::write_npy(folder + "/layer0.down.npy", arr(p.down, 300, 64));
  const std::string checkpoint = "/runs/\"quoted\"\n\\back\\slash}, \"x\": [";
  std::ofstream(folder + "/manifest.json")
      << "{\"checkpoint\": \"/runs/\\\"quoted\\\"\\n\\\\back\\\\slash}, \\\"x\\\": [\", \"l1_coef\": Infinity, "
         "\"train_log\": {\"nested\": [1, {\"deep\": null}]}, \"max_row_active\": [1e999]}";
  bench::Options o = captured_suite("real", d);
  o.from_dir = folder;
  std::ostringstream progress;
  std::vector<bench::Row> rows = bench::run(o, progress);
  ASSERT_EQ(rows.size(), 1u);
  rows[0].speedup = std::numeric_limits<double>::infinity();  // as a zero twell time would give
  rows[0].error = std::nan("");
  bench::write_results(rows, out.path(), "real");
  o.suite = "real_training";
  std::vector<bench::TrainingRow> training = bench::run_training(o, progress);
  ASSERT_EQ(training.size(), 1u);
  training[0].diff_dx = std::numeric_limits<double>::infinity();
  bench::write_training_results(training, out.path(), "real_training");
  for (const char* name : {"real", "real_training"}) {
    std::ifstream f(out.file(std::string(name) + ".json"));
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const testing::Json doc = testing::parse_json(text, "test", name);  // throws where it is not JSON
    ASSERT_EQ(doc.items().size(), 1u) << name;
    const testing::Json& row = doc[size_t(0)];
    EXPECT_EQ(row["source"].text(), folder + " layer 0") << name;
    EXPECT_EQ(row["checkpoint"].text(), checkpoint) << name;
    EXPECT_TRUE(row["checkpoint_l1_coef"].is_null()) << name;
    EXPECT_TRUE(row["max_row_active"].is_null()) << name;
    EXPECT_EQ(row["train_log"].dump(), "{\"nested\": [1, {\"deep\": null}]}") << name;
    EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 3) << name << ": a row per line\n" << text;
  }
  std::ifstream f(out.file("real.json"));
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const testing::Json row = testing::parse_json(text, "test", "real.json")[size_t(0)];
  EXPECT_TRUE(row["speedup"].is_null());
  EXPECT_TRUE(row["rel_error"].is_null());
}

// A custom case's results are named after the case: one custom run does not overwrite another's.
TEST(Capture, CustomResultsAreNamedAfterTheCase) {
  bench::Options o;
  o.suite = "custom";
  o.custom = {FfnKind::gated, 256, 2048, 5632, DType::bf16, Pattern::heavy_tailed, 0.005, 64, 1};
  EXPECT_EQ(bench::result_name(o), "custom-gated-bfloat16-m256-k2048-n5632-heavy_tailed-d0.005");
  bench::Options other = o;
  other.custom.m = 1;
  EXPECT_NE(bench::result_name(other), bench::result_name(o));
  o.suite = "training";
  EXPECT_EQ(bench::result_name(o), "training");
  o.one_case = true;
  EXPECT_EQ(bench::result_name(o).rfind("training-gated-", 0), 0u);
}

}  // namespace
}  // namespace twell::test
