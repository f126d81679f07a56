// CPU inference backend.
// Work decomposition: rows are processed in blocks of up to kBlockRows. Per block: the gate GEMM
// (OpenBLAS sgemm) writes G = x W1^T; one thread per row packs relu(G) into TwELL tiles; then one
// thread per compact row runs the fused up/down over its active neurons (two at a time, fp32), and
// routed rows (a tile over capacity, or a NaN or infinite gate value) run the same loop uncapped,
// or dense sgemms on the gathered rows where those hold more than N entries. Blocks of fewer rows
// than threads (decoding) split each row's entries over the threads instead, adding the partial
// sums. A block whose measured density exceeds options.dense_above runs its up/down densely.
// bfloat16 gate GEMMs run on the CPU's bf16 units where the build has oneDNN (cpu/onednn.hpp:
// the values their subnormal flushing could change computed again). Otherwise 16-bit weights are
// widened to fp32 at every run (the caller may change them in place between runs): the first
// weight whole (the gate GEMM reads it all), or, for runs of at most
// kStreamRows rows (decoding), a chunk of its rows at a time into a per-thread buffer that stays
// in cache, each chunk's gate columns by an sgemv / sgemm on it (the weight read once, 16-bit);
// up and down whole only where a block runs them densely or (float16) has more active entries
// than N, else row by row as the fused loop reads them (a decoding step touches a few dozen rows;
// bfloat16 rows are read as they are, each value widened in registers).
// NaN: the ReLU keeps NaN (cpu::relu) and every path computes h = relu(g) * u as a product, so a
// NaN or infinite value of x or a NaN gate weight reaches y as in the dense computation.
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/backend.hpp"
#include "cpu/blas.hpp"
#include "cpu/kernels.hpp"
#include "cpu/onednn.hpp"
#include "cpu/threads.hpp"

namespace twell::detail {

namespace {

constexpr int64_t kBlockRows = 256;         // rows per block: big enough for sgemm efficiency
// Blocks of fewer rows never run dense: a dense up and down streams both weight matrices whatever
// the row count (~14 ms at 2048 x 5632 fp32), more than even a fully active row costs sparse.
constexpr int64_t kMinDenseRows = 16;
// Rows fewer than the threads split their entries over the threads, at least this many a thread.
constexpr int64_t kSplitEntries = 32;
// Runs of at most this many rows stream a 16-bit first weight in chunks of kStreamChunk rows
// (64 x K fp32: 512 KiB at K = 2048) rather than widen it whole: widening writes and re-reads
// twice the weight's bytes, which more rows amortise and one row does not.
constexpr int64_t kStreamRows = 8;
constexpr int64_t kStreamChunk = 64;

// Byte offsets of the per-block buffers inside the workspace.
struct BlockLayout {
  int64_t rows, k, n, tiles, capacity;
  size_t xf, g, vals, cols, counts, routed, h, u, xr, yf, total;
  BlockLayout(int64_t rows_, int64_t k_, int64_t n_, int64_t tile, int64_t capacity_)
      : rows(rows_), k(k_), n(n_), tiles((n_ + tile - 1) / tile), capacity(capacity_) {
    size_t at = 0;
    auto take = [&at](size_t bytes) {
      const size_t here = at;
      at += (bytes + 63) / 64 * 64;
      return here;
    };
    xf = take(size_t(rows * k) * 4);
    g = take(size_t(rows * n) * 4);
    vals = take(size_t(rows * tiles * capacity) * 4);
    cols = take(size_t(rows * tiles * capacity) * 2);
    counts = take(size_t(rows * tiles) * 2);
    routed = take(size_t(rows) * 4);
    h = take(size_t(rows * n) * 4);
    u = take(size_t(rows * n) * 4);
    xr = take(size_t(rows * k) * 4);
    yf = take(size_t(rows * k) * 4);
    total = at;
  }
};

class CpuInference final : public InferenceBackend {
 public:
  CpuInference(const FfnWeights& w, const InferenceOptions& o)
      : kind_(w.kind), k_(w.hidden()), n_(w.intermediate()), dtype_(w.up.dtype), opt_(o) {
    set_weights(w);
  }

  void set_weights(const FfnWeights& w) override {
    w_ = w;
    auto keep = [this](const TensorView& t, std::vector<float>& copy) -> const float* {
      if (t.dtype == DType::f32) return static_cast<const float*>(t.data);
      copy.resize(size_t(t.numel()));  // 16-bit weights: an fp32 copy for the BLAS, made per run
      return copy.data();
    };
    first_ = keep(kind_ == FfnKind::gated ? w.gate : w.up, first_copy_);
    up_ = kind_ == FfnKind::gated ? keep(w.up, up_copy_) : nullptr;
    down_ = keep(w.down, down_copy_);
  }

  size_t workspace_bytes(int64_t rows) const override {
    return layout(std::min(rows, kBlockRows)).total;
  }

  void* own_workspace(size_t bytes, Stream) override {
    if (own_.size() < bytes) own_.resize(bytes);
    return own_.data();
  }

  RunInfo run(const InferenceArgs& a, Stream, void* workspace) override {
    const cpu::CallThreads team;
    RunInfo info;
    info.rows = a.x.shape[0];
    auto* ws = static_cast<uint8_t*>(workspace);
    rest_widened_ = dtype_ == DType::f32;
    stream_first_ = !rest_widened_ && info.rows <= kStreamRows && cpu::blas_in_parallel_is_serial();
    bf16_first_ = dtype_ == DType::bf16 && !stream_first_ && cpu::bf16_gemm_available();
    first_widened_ = false;
    if (!rest_widened_ && !stream_first_ && !bf16_first_ && info.rows > 0) widen_first();
    for (int64_t r0 = 0; r0 < info.rows; r0 += kBlockRows) {
      const int64_t rows = std::min(kBlockRows, info.rows - r0);
      run_block(a, r0, rows, ws, info);
    }
    if (a.counters.defined()) {
      auto* c = static_cast<int64_t*>(a.counters.data);
      c[0] = info.routed_rows;
      c[1] = info.active;
    }
    return info;
  }

 private:
  // A 16-bit weight into its fp32 copy. The plan holds views of the caller's weights, which may
  // change in place between runs (an optimizer step): a copy made once would compute with the old
  // values, so every run widens what it reads.
  void widen(const TensorView& view, std::vector<float>& copy) const {
    const int64_t total = view.numel(), chunk = int64_t(1) << 16;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < total; i += chunk)
      cpu::to_f32(static_cast<const uint8_t*>(view.data) + i * int64_t(dtype_size(dtype_)), dtype_,
                  copy.data() + i, std::min(chunk, total - i));
  }
  void widen_first() {
    if (first_widened_) return;
    widen(kind_ == FfnKind::gated ? w_.gate : w_.up, first_copy_);
    first_widened_ = true;
  }
  // g = x W1^T of a block: for bfloat16 on the CPU's bf16 units (oneDNN) with what their flushing
  // of subnormals changed computed again (cpu::bf16_gate_guard), else sgemm on fp32 (the
  // 16-bit first weight widened once per run).
  void gate_block(const InferenceArgs& a, int64_t r0, int64_t rows, const float* x, float* g) {
    if (bf16_first_) {
      const auto* first = static_cast<const uint16_t*>((kind_ == FfnKind::gated ? w_.gate : w_.up).data);
      const auto* xb = static_cast<const uint16_t*>(a.x.data) + r0 * k_;
      if (cpu::gemm_nt_bf16(rows, n_, k_, xb, first, g, n_)) {
        cpu::bf16_gate_guard(rows, n_, k_, x, first, g);
        return;
      }
      widen_first();  // oneDNN refused this problem: the fp32 path
    }
    cpu::gemm_nt(rows, n_, k_, x, first_, g);
  }
  // g = x W1^T for a few rows, the 16-bit first weight widened kStreamChunk rows at a time into
  // the thread's cache-sized buffer (the BLAS call runs on one thread inside the parallel loop:
  // only with an OpenBLAS that runs serially there, the OpenMP build's rule).
  void gate_streamed(int64_t rows, const float* x, float* g) {
    const TensorView& first = kind_ == FfnKind::gated ? w_.gate : w_.up;
    const size_t chunk = size_t(kStreamChunk) * size_t(k_);
    if (stream_buffer_.size() < size_t(omp_get_max_threads()) * chunk)
      stream_buffer_.resize(size_t(omp_get_max_threads()) * chunk);
    const auto* src = static_cast<const uint8_t*>(first.data);
    const int64_t es = int64_t(dtype_size(dtype_));
    cpu::blas_int(n_, "columns");  // the BLAS calls' size checks, before the region (no throw in it)
    cpu::blas_int(k_, "depth");
    cpu::blas_int(rows, "rows");
#pragma omp parallel for schedule(static)
    for (int64_t n0 = 0; n0 < n_; n0 += kStreamChunk) {
      const int64_t count = std::min(kStreamChunk, n_ - n0);
      float* buf = stream_buffer_.data() + size_t(omp_get_thread_num()) * chunk;
      cpu::to_f32(src + n0 * k_ * es, dtype_, buf, count * k_);
      cpu::gemm_nt(rows, count, k_, x, buf, g + n0, 0.0f, n_);
    }
  }
  // Up (gated) and down whole, once per run, before anything reads them through up_ / down_.
  void widen_rest() {
    if (rest_widened_) return;
    if (kind_ == FfnKind::gated) widen(w_.up, up_copy_);
    widen(w_.down, down_copy_);
    rest_widened_ = true;
  }
  // Weight row n of up (gated) or down for the fused loop: the widened copy's, or widened into
  // slot `slot` (k_ floats) of `scratch` while the run has not widened them whole.
  const float* weight_row(const TensorView& view, const float* widened, int64_t n, float* scratch,
                          int slot) const {
    if (rest_widened_) return widened + n * k_;
    float* row = scratch + slot * k_;
    cpu::to_f32(static_cast<const uint8_t*>(view.data) + n * k_ * int64_t(dtype_size(dtype_)), dtype_, row, k_);
    return row;
  }
  // Per-thread room for the rows fused_row widens (4 of k_ floats a thread; none once widened,
  // nor for bfloat16, whose rows it reads as they are).
  std::vector<float> row_scratch() const {
    return rest_widened_ || dtype_ == DType::bf16
               ? std::vector<float>()
               : std::vector<float>(size_t(omp_get_max_threads()) * 4 * size_t(k_));
  }
  float* thread_scratch(std::vector<float>& s) const {
    return s.empty() ? nullptr : s.data() + size_t(omp_get_thread_num()) * 4 * size_t(k_);
  }

  BlockLayout layout(int64_t rows) const {
    return BlockLayout(std::max<int64_t>(rows, 1), k_, n_, opt_.tile, opt_.capacity);
  }

  void run_block(const InferenceArgs& a, int64_t r0, int64_t rows, uint8_t* ws, RunInfo& info) {
    const BlockLayout L = layout(rows);
    const size_t es = dtype_size(dtype_);
    const float* x = dtype_ == DType::f32 ? static_cast<const float*>(a.x.data) + r0 * k_
                                          : reinterpret_cast<float*>(ws + L.xf);
    float* y = dtype_ == DType::f32 ? static_cast<float*>(a.y.data) + r0 * k_
                                    : reinterpret_cast<float*>(ws + L.yf);
    if (dtype_ != DType::f32)
      cpu::to_f32(static_cast<const uint8_t*>(a.x.data) + r0 * k_ * es, dtype_,
                  const_cast<float*>(x), rows * k_);
    float* g = reinterpret_cast<float*>(ws + L.g);
    if (stream_first_)
      gate_streamed(rows, x, g);
    else
      gate_block(a, r0, rows, x, g);

    std::vector<int64_t> nnz(static_cast<size_t>(rows));
    std::vector<uint8_t> over(static_cast<size_t>(rows)), finite(static_cast<size_t>(rows));
    auto* vals = reinterpret_cast<float*>(ws + L.vals);
    auto* cols = reinterpret_cast<uint16_t*>(ws + L.cols);
    auto* counts = reinterpret_cast<uint16_t*>(ws + L.counts);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) pack_row(L, g + r * n_, r, vals, cols, counts, nnz, over, finite);

    int64_t active = 0;
    auto* routed = reinterpret_cast<int32_t*>(ws + L.routed);
    int64_t num_routed = 0;
    for (int64_t r = 0; r < rows; ++r) {
      active += nnz[size_t(r)];
      if (over[size_t(r)]) routed[num_routed++] = int32_t(r);
    }
    info.active += active;
    const bool dense =
        opt_.dispatch == Dispatch::force_dense ||
        (opt_.dispatch == Dispatch::automatic && rows >= kMinDenseRows &&
         double(active) > opt_.dense_above * double(rows * n_));
    // Up and down widened whole for the dense GEMMs, and for float16 past N active entries (row
    // by row would convert more than the whole); bfloat16 rows are read as they are by the fused
    // loop (fused_row), cheaper than writing and re-reading whole fp32 copies at any density the
    // sparse path runs.
    if (dense || (dtype_ != DType::bf16 && active > n_)) widen_rest();
    if (dense) {
      info.ran_dense = true;
      dense_rest(L, rows, x, g, ws, y);
    } else {
      info.routed_rows += num_routed;
      sparse_rows(L, rows, x, vals, cols, counts, over, y);
      routed_rows(L, num_routed, routed, nnz, finite, x, g, ws, y);
    }
    if (dtype_ != DType::f32)
      cpu::from_f32(y, dtype_, static_cast<uint8_t*>(a.y.data) + r0 * k_ * es, rows * k_);
  }

  // Packs relu(g_row) into row r's TwELL tiles; flags the row when a tile overflows or a gate value
  // is NaN or infinite (as every one is when x's row is not finite): the backup then multiplies
  // every relu(g) by its u, as the dense product does (0 * Inf = NaN).
  void pack_row(const BlockLayout& L, const float* grow, int64_t r, float* vals, uint16_t* cols,
                uint16_t* counts, std::vector<int64_t>& nnz, std::vector<uint8_t>& over,
                std::vector<uint8_t>& finite) const {
    int64_t total = 0;
    finite[size_t(r)] = cpu::all_finite(grow, n_);
    bool overflow = !finite[size_t(r)];
    for (int64_t t = 0; t < L.tiles; ++t) {
      const int64_t c0 = t * opt_.tile, c1 = std::min<int64_t>(n_, c0 + opt_.tile);
      const int64_t slot0 = (r * L.tiles + t) * L.capacity;
      int64_t cnt = 0;
      for (int64_t c = c0; c < c1; ++c) {
        const float v = grow[c];
        if (!cpu::relu_active(v)) continue;
        if (cnt < L.capacity) {
          vals[slot0 + cnt] = v;
          cols[slot0 + cnt] = uint16_t(c - c0);
        }
        ++cnt;
      }
      counts[r * L.tiles + t] = uint16_t(std::min<int64_t>(cnt, L.capacity));
      overflow = overflow || cnt > L.capacity;
      total += cnt;
    }
    nnz[size_t(r)] = total;
    over[size_t(r)] = overflow;
  }

  // Fused up/down for compact rows: y_r = sum over active n of g * (x_r . Wu[n]) * Wd[n].
  // (The rows' neuron lists are allocated before the parallel loop: an exception cannot leave it.)
  void sparse_rows(const BlockLayout& L, int64_t rows, const float* x, const float* vals,
                   const uint16_t* cols, const uint16_t* counts, const std::vector<uint8_t>& over,
                   float* y) const {
    const int64_t per_row = L.tiles * L.capacity;
    std::vector<int64_t> active(size_t(rows * per_row));
    std::vector<float> gate(active.size());
    // compact rows only: a routed one (over capacity) goes through routed_rows
    fused_rows(rows, [&](int64_t r) {
      int64_t* nrn = active.data() + r * per_row;
      float* g = gate.data() + r * per_row;
      return over[size_t(r)] ? FusedRow{}
                             : FusedRow{x + r * k_, nrn, g, compact_entries(L, r, vals, cols, counts, nrn, g),
                                        y + r * k_};
    });
  }

  // fused_row over the rows make(i) gives for i < count (a row with y == nullptr: skipped), each
  // on one thread, or, for fewer rows than threads (a decoding step), their entries split over
  // the threads (fused_rows_split). make runs inside the parallel loop.
  template <typename MakeRow>
  void fused_rows(int64_t count, const MakeRow& make) const {
    std::vector<float> scratch = row_scratch();
    if (count < omp_get_max_threads()) {
      std::vector<FusedRow> list;
      for (int64_t i = 0; i < count; ++i)
        if (const FusedRow row = make(i); row.y != nullptr) list.push_back(row);
      fused_rows_split(list, scratch);
      return;
    }
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t i = 0; i < count; ++i) {
      const FusedRow row = make(i);
      if (row.y != nullptr) fused_row(row.x, row.nrn, row.g, row.count, row.y, thread_scratch(scratch));
    }
  }

  // Compact row r's active neurons and gate values from its TwELL tiles; returns their count.
  int64_t compact_entries(const BlockLayout& L, int64_t r, const float* vals, const uint16_t* cols,
                          const uint16_t* counts, int64_t* nrn, float* g) const {
    int64_t count = 0;
    for (int64_t t = 0; t < L.tiles; ++t) {
      const int64_t slot0 = (r * L.tiles + t) * L.capacity;
      for (int64_t e = 0; e < counts[r * L.tiles + t]; ++e, ++count) {
        nrn[count] = t * opt_.tile + cols[slot0 + e];
        g[count] = vals[slot0 + e];
      }
    }
    return count;
  }

  struct FusedRow {
    const float* x = nullptr;
    const int64_t* nrn = nullptr;
    const float* g = nullptr;
    int64_t count = 0;
    float* y = nullptr;  // nullptr: no row (fused_rows skips it)
  };

  // fused_row for rows fewer than the threads (a decoding step), in one parallel region: each
  // row's entries in up to ceil(threads / rows) contiguous parts of at least kSplitEntries, part
  // 0 into y's row and the others into partial rows, added afterwards (fp32, as the loop sums).
  void fused_rows_split(const std::vector<FusedRow>& rows, std::vector<float>& scratch) const {
    if (rows.empty()) return;
    const int64_t threads = omp_get_max_threads(), count = int64_t(rows.size());
    const int64_t most = std::max<int64_t>(1, (threads + count - 1) / count);
    struct Part {
      size_t row;
      int64_t begin, end;
      float* out;
    };
    std::vector<int64_t> parts_of(rows.size());
    int64_t partials = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      parts_of[i] = std::clamp<int64_t>(rows[i].count / kSplitEntries, 1, most);
      partials += parts_of[i] - 1;
    }
    std::vector<float> partial(size_t(partials) * size_t(k_));
    std::vector<Part> parts;
    float* next = partial.data();
    for (size_t i = 0; i < rows.size(); ++i)
      for (int64_t p = 0; p < parts_of[i]; ++p) {
        const int64_t c = rows[i].count;
        parts.push_back({i, c * p / parts_of[i], c * (p + 1) / parts_of[i], p == 0 ? rows[i].y : next});
        if (p > 0) next += k_;
      }
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t j = 0; j < parts.size(); ++j) {
      const Part& q = parts[j];
      const FusedRow& r = rows[q.row];
      fused_row(r.x, r.nrn + q.begin, r.g + q.begin, q.end - q.begin, q.out, thread_scratch(scratch));
    }
    const float* add = partial.data();
    for (size_t i = 0; i < rows.size(); ++i)
      for (int64_t p = 1; p < parts_of[i]; ++p, add += k_)
        for (int64_t c = 0; c < k_; ++c) rows[i].y[c] += add[c];
  }

  // y_row = sum_i h_i Wd[n_i] with h_i = g_i * (x_row . Wu[n_i]) (gated) or g_i (plain); neurons
  // are taken two at a time so that four weight rows stream at once. Weight rows: the fp32 ones,
  // 16-bit rows widened into scratch (4 x k_ floats; weight_row), or bfloat16 rows as they are
  // (widened in registers by the kernels: the same products and sums).
  void fused_row(const float* xr, const int64_t* nrn, const float* g, int64_t count, float* yr,
                 float* scratch) const {
    std::memset(yr, 0, size_t(k_) * sizeof(float));
    if (dtype_ == DType::bf16 && !rest_widened_) {
      const auto* up = static_cast<const uint16_t*>(w_.up.data);
      const auto* down = static_cast<const uint16_t*>(w_.down.data);
      fused_loop(xr, nrn, g, count, yr, [&](int64_t n, int) { return up + n * k_; },
                 [&](int64_t n, int) { return down + n * k_; });
      return;
    }
    fused_loop(xr, nrn, g, count, yr,
               [&](int64_t n, int slot) { return weight_row(w_.up, up_, n, scratch, slot); },
               [&](int64_t n, int slot) { return weight_row(w_.down, down_, n, scratch, slot); });
  }
  template <typename Up, typename Down>
  void fused_loop(const float* xr, const int64_t* nrn, const float* g, int64_t count, float* yr,
                  const Up& up, const Down& down) const {
    const bool gated = kind_ == FfnKind::gated;
    int64_t i = 0;
    for (; i + 1 < count; i += 2) {
      float h0 = g[i], h1 = g[i + 1];
      if (gated) {
        float u0, u1;
        cpu::dot2(xr, up(nrn[i], 0), up(nrn[i + 1], 1), k_, &u0, &u1);
        h0 *= u0;
        h1 *= u1;
      }
      cpu::axpy2(h0, down(nrn[i], 2), h1, down(nrn[i + 1], 3), yr, k_);
    }
    if (i < count) {
      const float h = gated ? g[i] * cpu::dot(xr, up(nrn[i], 0), k_) : g[i];
      cpu::axpy(h, down(nrn[i], 2), yr, k_);
    }
  }

  // Backup path for routed rows (a tile over capacity), exact either way. The block's full gate
  // rows are at hand, so routed rows can run the same fused up/down straight from their gate rows,
  // uncapped: that reads 2 weight rows per active entry. Gathering them into dense sgemms instead
  // reads every weight row once, which is cheaper only when the routed rows hold more than N
  // active entries between them. A row with a NaN or infinite gate value takes every neuron, the
  // inactive ones with relu(g) = 0: its u may be infinite, and 0 * Inf is NaN in the dense product.
  void routed_rows(const BlockLayout& L, int64_t count, const int32_t* routed,
                   const std::vector<int64_t>& nnz, const std::vector<uint8_t>& finite, const float* x,
                   const float* g, uint8_t* ws, float* y) {
    int64_t routed_active = 0;
    for (int64_t i = 0; i < count; ++i)
      routed_active += finite[size_t(routed[i])] ? nnz[size_t(routed[i])] : n_;
    if (routed_active <= n_) {
      // Row i's neurons at offset[i] of one list of routed_active entries, allocated here: an
      // exception cannot leave the parallel loop.
      std::vector<int64_t> offset(size_t(count) + 1, 0);
      std::vector<int64_t> active(static_cast<size_t>(routed_active));
      std::vector<float> gate(active.size());
      for (int64_t i = 0; i < count; ++i)
        offset[size_t(i) + 1] = offset[size_t(i)] + (finite[size_t(routed[i])] ? nnz[size_t(routed[i])] : n_);
      fused_rows(count, [&](int64_t i) {  // routed row i's neurons and relu(g) into its list
        const int64_t r = routed[i];
        const bool every = !finite[size_t(r)];
        int64_t* nrn = active.data() + offset[size_t(i)];
        float* gr = gate.data() + offset[size_t(i)];
        int64_t n = 0;
        for (int64_t c = 0; c < n_; ++c)
          if (every || cpu::relu_active(g[r * n_ + c])) nrn[n] = c, gr[n++] = cpu::relu(g[r * n_ + c]);
        return FusedRow{x + r * k_, nrn, gr, n, y + r * k_};
      });
      return;
    }
    widen_rest();  // the dense GEMMs below read up and down whole
    auto* xg = reinterpret_cast<float*>(ws + L.xr);
    auto* h = reinterpret_cast<float*>(ws + L.h);
    for (int64_t i = 0; i < count; ++i) {
      std::memcpy(xg + i * k_, x + routed[i] * k_, size_t(k_) * sizeof(float));
      std::memcpy(h + i * n_, g + routed[i] * n_, size_t(n_) * sizeof(float));
    }
    hidden_from_gate(count, xg, h, reinterpret_cast<float*>(ws + L.u));
    float* yg = xg;  // the gathered x rows are no longer needed once h exists
    cpu::gemm_nn(count, k_, n_, h, down_, yg);
    for (int64_t i = 0; i < count; ++i)
      std::memcpy(y + routed[i] * k_, yg + i * k_, size_t(k_) * sizeof(float));
  }

  // h = relu(g) * (x Wu^T) (gated; u is scratch for the up GEMM; a product even where relu(g) is
  // 0, as in the dense layer) or relu(g) (plain), in place over h, which holds g on entry.
  void hidden_from_gate(int64_t rows, const float* x, float* h, float* u) const {
    if (kind_ == FfnKind::gated) cpu::gemm_nt(rows, n_, k_, x, up_, u);
    const bool gated = kind_ == FfnKind::gated;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < rows * n_; ++i) h[i] = gated ? cpu::relu(h[i]) * u[i] : cpu::relu(h[i]);
  }

  // Up and down as dense GEMMs for the whole block (the dispatch's dense path).
  void dense_rest(const BlockLayout& L, int64_t rows, const float* x, float* g, uint8_t* ws,
                  float* y) const {
    hidden_from_gate(rows, x, g, reinterpret_cast<float*>(ws + L.u));
    cpu::gemm_nn(rows, k_, n_, g, down_, y);
  }

  FfnKind kind_;
  int64_t k_, n_;
  DType dtype_;
  InferenceOptions opt_;
  FfnWeights w_;  // views of the caller's weights
  bool rest_widened_ = true;  // up_ and down_ hold this run's values (fp32 weights: always)
  bool stream_first_ = false;  // this run streams the 16-bit first weight (gate_streamed)
  bool bf16_first_ = false;    // this run's gate GEMMs are bf16 ones (gate_block)
  bool first_widened_ = false;  // first_copy_ holds this run's widened first weight
  std::vector<float> stream_buffer_;  // gate_streamed's per-thread chunks
  std::vector<float> first_copy_, up_copy_, down_copy_;
  const float* first_ = nullptr;
  const float* up_ = nullptr;
  const float* down_ = nullptr;
  std::vector<uint8_t> own_;
};

}  // namespace

std::unique_ptr<InferenceBackend> make_cpu_inference(const FfnWeights& w, const InferenceOptions& o) {
  return std::make_unique<CpuInference>(w, o);
}

}  // namespace detail
