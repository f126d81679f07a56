// Automatic dispatch without a host synchronisation. An eager run copies its activation count
// into pinned memory behind an event (its density), and while its regime tries the paths it is
// timed with a pair of events; a later call polls them (never waits). For every regime (M rounded
// to a power of two, density to a factor of ~1.4) the first runs try each path three times
// (PathTimes::kTrials: runs that carry one-time host work, e.g. cuBLASLt's algorithm choice,
// between their events are among them), then the path with the smaller best time runs (inference:
// sparse only where it beats dense by DispatchConfig::kSparseMargin), and only
// every DispatchConfig::kProbeEvery-th run probes the density. Up to DispatchConfig::kGraphTimedRows
// rows a trial after a path's first run is captured into a private graph and one replay is timed:
// the GPU time, without the gaps between launches that bind small eager runs.
// Densities above the plan's dense_above run dense without a trial. A captured run takes no
// trial: the faster path measured so far in its regime, or sparse before both ran; the graph
// keeps that path.
//   inference (DispatchCalibration): one run, one pair of events;
//   training (TrainingCalibration): a step is a forward and the backward of the same saved
//     buffer, each bracketed by its own events (other work may run between them); the step's
//     time is the sum. One step is measured at a time; a forward whose backward never comes is
//     dropped when the next forward starts.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <map>
#include <utility>

#include "core/capacity.hpp"
#include "cuda/policy/config.hpp"
#include "cuda/runtime/no_copy.hpp"
#include "twell/ffn.hpp"

namespace twell::gpu {

// The best measured time of each path (0 sparse or compact, 1 dense) per regime, and the choice.
class PathTimes {
 public:
  // sparse_margin: the fraction by which the sparse path's best time must beat dense's for it to
  // be chosen (0: the faster; a tie goes to sparse).
  explicit PathTimes(double sparse_margin = 0.0) : sparse_margin_(sparse_margin) {}
  // A finished run of `rows` rows at `density` on the given path took `ms`.
  void add(int64_t rows, double density, bool dense, float ms);
  // What dispatch does for a run of `rows` rows at the last measured `density`:
  struct Decision {
    // An eager run's path (true: dense): sparse before any measurement, dense above dense_above,
    // then alternating until each path ran kTrials times in the regime, then the faster.
    bool dense = false;
    bool trying = true;  // the regime still runs trials (before any density: yes)
    // The path a CUDA-graph capture bakes in: no trial (a graph replays its capture's path for
    // good), the faster measured path where both ran, else sparse (dense above dense_above).
    bool settled_dense = false;
  };
  Decision decide(int64_t rows, double density, double dense_above) const;
  bool prefer_dense(int64_t rows, double density, double dense_above) const {
    return decide(rows, density, dense_above).dense;
  }

 private:
  using Regime = std::pair<int, int>;  // (log2 rows, density bucket)
  // Timed runs of each path before choosing: a path's first run carries one-time host work
  // (cuBLASLt's algorithm choice, lazy module loading), and so does the sparse path's run that
  // first sends routed rows through cuBLAS (RoutedCapacity), usually its second.
  static constexpr int kTrials = 3;
  struct Times {
    float best_ms[2] = {0, 0};  // per path: fastest measured
    int runs[2] = {0, 0};
  };
  static Regime regime(int64_t rows, double density);
  double sparse_margin_;
  std::map<Regime, Times> times_;
};

// A CUDA event owned for the object's lifetime (flags: cudaEventDefault times, cudaEventDisableTiming
// only orders).
class OwnedEvent : NoCopy {
 public:
  OwnedEvent(unsigned flags, const char* op);
  ~OwnedEvent();
  operator cudaEvent_t() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// A device count (T: unsigned long long or int32_t) copied into pinned memory behind an event by
// record(); poll() reads the last one once its event has passed, never waiting (a later record
// overwrites an earlier one).
template <typename T>
class PinnedCount : NoCopy {
 public:
  explicit PinnedCount(const char* op);
  ~PinnedCount();

  void record(const T* device_count, cudaStream_t s);
  bool pending() const { return pending_; }
  // Whether the recorded count arrived in this call (then value() is it).
  bool poll();
  T value() const { return *host_; }

 private:
  const char* op_;
  OwnedEvent copied_;
  T* host_ = nullptr;  // pinned
  bool pending_ = false;
};

// A run's activation count, as a density of its rows x cols.
class DensityProbe {
 public:
  explicit DensityProbe(const char* op) : count_(op) {}

  void record(const unsigned long long* device_active, int64_t rows, int64_t cols, cudaStream_t s);
  bool pending() const { return count_.pending(); }
  // Whether the recorded count arrived in this call (then density() is its density).
  bool poll();
  double density() const { return density_; }  // the last arrived count's; -1: none yet

 private:
  PinnedCount<unsigned long long> count_;
  double elements_ = 0;
  double density_ = -1;
};

// How many routed rows a run sends through cuBLAS (RoutedBlasConfig): each eager run's routed
// count is recorded; capacity() polls the last one and sizes C from it. Before any count arrives,
// after a run that routed none, and always under Determinism::deterministic (every routed row on
// the tensor-core kernel: bit-identical reruns), 0.
class RoutedCapacity {
 public:
  RoutedCapacity(const char* op, Determinism determinism)
      : count_(op), enabled_(determinism == Determinism::fast) {}

  // Records the run's count (device memory; nothing while capturing or deterministic).
  void record(const int32_t* device_count, int64_t rows, bool capturing, cudaStream_t s);
  // C for a run of `rows` rows, at most `limit` (the buffers' rows). Polls unless capturing.
  int64_t capacity(int64_t rows, int64_t limit, bool capturing);

 private:
  PinnedCount<int32_t> count_;
  bool enabled_;
  int64_t pending_rows_ = 0;            // the rows of the run whose count is in flight
  int64_t last_ = 0, last_rows_ = 0;    // the last count that arrived, and its run's rows
  int64_t capacity_ = 0;                // the last C handed out (kept while it still fits)
};

// The most entries of a compact row that one warp of inference's row kernels computes (longer
// rows: a CTA of the long-row kernel): RowConfig::kLongRow, or under Determinism::fast, once a
// density (fraction of `cols`; < 0: none yet) was measured, kLongRowMeans x a row's mean entries
// within [kMinLongRow, kLongRow].
int32_t long_row_limit(double density, int64_t cols, Determinism determinism);

// The compact saved state's capacity under automatic dispatch (TrainingOptions::min_capacity;
// detail::CapacityChoice has the rule): each eager compact forward's routed count is recorded with
// its rows and capacity, and capacity() polls the last one before choosing.
class SavedCapacity {
 public:
  SavedCapacity(const char* op, int32_t tile, int32_t capacity, int32_t min_capacity)
      : count_(op), choice_(tile, capacity, min_capacity) {}

  void record(const int32_t* device_routed, int64_t rows, int32_t capacity, cudaStream_t s);
  // The next step's capacity at `density` (TrainingCalibration::density()). Polls, never waits.
  int32_t capacity(double density);

 private:
  PinnedCount<int32_t> count_;
  detail::CapacityChoice choice_;
  int64_t pending_rows_ = 0;
  int32_t pending_capacity_ = 0;
};

class DispatchCalibration {
 public:
  DispatchCalibration();

  // A run of `rows` rows: its path, and how it is measured.
  struct Choice {
    bool dense = false;  // the path (before any density is known: sparse)
    // Timed: an eager run while its regime tries the paths, one measurement in flight at a time.
    bool timed = false;
    // Timed as a graph replay (DispatchConfig::kGraphTimedRows): few rows, and the path ran once
    // before in this plan (its first run loads modules and chooses algorithms, which a capture
    // must not do).
    bool graph = false;
  };
  // Polls the last measurement unless capturing (a captured run takes no trial: the regime's
  // settled path).
  Choice choose(int64_t rows, double dense_above, bool capturing);
  // Bracket an eager run: start() before its first kernel, finish() after its last (the count
  // is probed, and the run timed where choose() said so).
  void start(const Choice& c, cudaStream_t s);
  void finish(const unsigned long long* device_active, int64_t rows, int64_t cols, bool dense,
              cudaStream_t s);
  // The density the last probed run measured (-1: none yet).
  double density() const { return probe_.density(); }

 private:
  void poll();

  OwnedEvent begin_, end_;  // the run, timed
  DensityProbe probe_;      // its density
  bool pending_ = false;        // a count (and maybe a time) in flight
  bool pending_timed_ = false, pending_dense_ = false;
  bool timing_ = false;         // the run between start() and finish() is timed
  int unprobed_ = 0;            // untimed runs since the last probe
  bool ran_[2] = {false, false};  // per path (0 sparse, 1 dense): a timed run finished once
  int64_t pending_rows_ = 0;
  PathTimes times_{DispatchConfig::kSparseMargin};
};

// A graph-timed trial's stream: run() captures enqueue(p) on the private stream p, then replays the
// graph once on p after the work already on s, between before(p) and after(p) (the timing events);
// s's later work waits for the replay. The graph is freed once the replay completes.
class GraphTrial : NoCopy {
 public:
  explicit GraphTrial(const char* op);  // on the current device
  ~GraphTrial();
  void run(cudaStream_t s, const std::function<void(cudaStream_t)>& enqueue,
           const std::function<void(cudaStream_t)>& before, const std::function<void(cudaStream_t)>& after);

 private:
  const char* op_;
  cudaStream_t stream_ = nullptr;
  OwnedEvent fork_, join_;
};

class TrainingCalibration {
 public:
  TrainingCalibration();

  // The saved form for a step of `rows` rows (true: dense), as PathTimes chooses at the density
  // the last finished forward measured.
  bool prefer_dense(int64_t rows, double dense_above);
  // The density the last finished forward measured, as prefer_dense last polled it (-1: none yet).
  double density() const { return probe_.density(); }
  // Eager forwards and backwards only. `saved` identifies the step (the saved buffer).
  void forward_start(const void* saved, cudaStream_t s);
  void forward_finish(const unsigned long long* device_active, int64_t rows, int64_t cols, bool dense,
                      cudaStream_t s);
  void backward_start(const void* saved, cudaStream_t s);
  void backward_finish(cudaStream_t s);

 private:
  enum class Stage : uint8_t { idle, forward, awaiting_backward, backward, timed };
  void poll();

  OwnedEvent f0_, f1_, b0_, b1_;  // the measured step's forward and backward, timed
  DensityProbe probe_;            // every forward's density
  Stage stage_ = Stage::idle;
  const void* saved_ = nullptr;   // the measured step's saved buffer
  bool step_dense_ = false;
  int64_t step_rows_ = 0;
  double step_density_ = -1;      // the measured step's density, once its count arrived
  bool count_is_step_ = false;    // the probe's last count belongs to the measured step
  PathTimes times_;
};

}  // namespace twell::gpu
