// FFN problems captured from a model (`python -m twell.capture`): per decoder layer i, in one folder,
//   layer{i}.x.npy     [M, K]  the MLP's input on some text
//   layer{i}.gate.npy  [N, K]  gate_proj.weight (absent: a plain FFN)
//   layer{i}.up.npy    [N, K]  up_proj.weight
//   layer{i}.down.npy  [N, K]  down_proj.weight transposed (neuron-major)
// NumPy .npy files (format 1.0 to 3.0), C order, one dtype per layer: '<f4' float32, '<f2' float16,
// '<u2' bfloat16 (raw bits: NumPy has no bfloat16). Layers are numbered from 0 without gaps.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "json.hpp"
#include "workload.hpp"

namespace twell::testing {

// A 2-D array read from an .npy file: its dtype, shape and bytes (row-major).
struct NpyArray {
  DType dtype = DType::f32;
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> bytes;
};
// Throws Error naming the file for anything but a regular file holding a 2-D C-order array of the
// three dtypes above, or a file shorter than its header says.
NpyArray read_npy(const std::string& path);
// The same checks, reading the header only: the dtype and shape, no bytes.
NpyArray read_npy_shape(const std::string& path);
// Writes a 2-D array in the same format (tests; the capture side is Python's).
void write_npy(const std::string& path, const NpyArray& a);

// Layer i of a capture as a Problem (spec.pattern == captured, spec.density == 0: measured by the
// run), its x cut to the first max_rows rows (0: all). Throws Error naming the file or the
// mismatch (shapes, dtypes, an x of no rows) when the layer's files do not describe one FFN.
Problem load_captured_layer(const std::string& dir, int layer, int64_t max_rows = 0);
// A capture folder as a run reads it, once: its layers (layer0 .. layer{L-1}, every one of them
// checked from its files' headers as load_captured_layer checks it) and its manifest.json (null
// without one; else a JSON object of at most 16 MiB and 65536 values, each member name once).
// Error if the folder is not one, holds no layer, or any of that fails. A name that is there but
// no regular file (a directory, a FIFO, a link to nothing) is refused naming it, never taken for
// a missing file (a missing gate file: a plain FFN; the first missing x ends the layers).
struct CaptureFolder {
  int layers = 0;
  Json manifest;
};
CaptureFolder read_capture(const std::string& dir);
int captured_layers(const std::string& dir);  // read_capture(dir).layers
// What a capture's manifest (read_capture's) says of the model behind layer i, as an object for a
// result row: {"checkpoint", "checkpoint_l1_coef" (its "l1_coef"), "train_log", "max_row_active"
// (its entry for layer i)}, each value as the manifest holds it (null where it has none). An
// empty object for a null manifest.
Json capture_model(const Json& manifest, int layer);
// The same from the folder's manifest.json, read now: Error when it is not as read_capture wants.
Json capture_model(const std::string& dir, int layer);

}  // namespace twell::testing
