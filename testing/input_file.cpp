#include "input_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "twell/error.hpp"

namespace twell::testing {

namespace {

// What a file-system entry is, in words for an Error.
std::string describe(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  return "not a regular file";
}

}  // namespace

PathKind path_kind(const std::string& path) {
  struct stat st{};
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISREG(st.st_mode)) return PathKind::regular;
    return S_ISDIR(st.st_mode) ? PathKind::directory : PathKind::other;
  }
  // Missing only where no entry has the name: a link to nothing or a loop of links is there
  // (lstat finds it), and so may be what a search permission hides.
  if (errno != ENOENT) return PathKind::other;
  return ::lstat(path.c_str(), &st) == 0 ? PathKind::other : PathKind::missing;
}

InputFile::InputFile(const std::string& path, const char* op) : path_(path), op_(op) {
  const std::string want = "a readable regular file";
  // O_NONBLOCK: opening a FIFO returns at once (fstat then refuses it); a regular file's reads
  // are unaffected by the flag.
  fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd_ < 0) {
    const int error = errno;
    struct stat link{};
    if (error == ENOENT && ::lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode))
      throw Error(op, path, want, "a dangling symbolic link");
    throw Error(op, path, want, error == ENOENT ? "no such file" : std::strerror(error));
  }
  struct stat st{};
  const bool stated = ::fstat(fd_, &st) == 0;
  if (!stated || !S_ISREG(st.st_mode)) {
    const std::string what = stated ? describe(st.st_mode) : std::string(std::strerror(errno));
    ::close(fd_);
    fd_ = -1;
    throw Error(op, path, want, what);
  }
  size_ = uint64_t(st.st_size);
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

bool InputFile::read(void* out, uint64_t bytes) {
  auto* p = static_cast<char*>(out);
  while (bytes > 0) {
    const ssize_t n = ::read(fd_, p, size_t(std::min<uint64_t>(bytes, uint64_t(1) << 30)));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    bytes -= uint64_t(n);
    offset_ += uint64_t(n);
  }
  return true;
}

std::string InputFile::read_rest(uint64_t max_bytes) {
  const uint64_t left = size_ > offset_ ? size_ - offset_ : 0;
  if (left > max_bytes)
    throw Error(op_, path_, "at most " + std::to_string(max_bytes) + " bytes", std::to_string(left) + " bytes");
  std::string s(size_t(left), '\0');
  if (left > 0 && !read(&s[0], left)) throw Error(op_, path_, std::to_string(left) + " readable bytes", "a read error");
  return s;
}

}  // namespace twell::testing
