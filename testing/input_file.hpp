// Reading a file named by a user (a capture's .npy files, its manifest.json): regular files only.
// A directory, a FIFO, a device or a socket is refused before anything is read, and opening never
// blocks (a FIFO without a writer would hang an ordinary open).
#pragma once
#include <cstdint>
#include <string>

namespace twell::testing {

// What a path names (following links), without opening it: nothing (no entry of that name), a
// regular file, a directory, or something else (a FIFO, a device, a socket, a link to nothing or a
// loop of links, a path it may not search): a name that is there is never "missing".
enum class PathKind : uint8_t { missing, regular, directory, other };
PathKind path_kind(const std::string& path);

// An open regular file (through links), read from its start. The constructor throws Error(op, path,
// "a readable regular file", what it is) for a missing or unreadable path, a link to nothing, or
// anything but a regular file.
class InputFile {
 public:
  InputFile(const std::string& path, const char* op);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  uint64_t size() const { return size_; }      // bytes, as the file system reported at opening
  uint64_t offset() const { return offset_; }  // bytes read so far
  // Reads exactly `bytes` bytes into `out`; false at the end of the file first (or a read error).
  bool read(void* out, uint64_t bytes);
  // The rest of the file as a string; Error naming the file when it holds more than max_bytes.
  std::string read_rest(uint64_t max_bytes);

 private:
  std::string path_;
  const char* op_;
  int fd_ = -1;
  uint64_t size_ = 0, offset_ = 0;
};

}  // namespace twell::testing
