// TensorBoard event files (event_file.h).
#include "event_file.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "multinorm/checksum.h"
#include "multinorm/error.h"
#include "tensorboard_event.pb.h"

namespace multinorm {

namespace {
double now_s() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::string serialized(const tensorboard::Event& e) {
  std::string s;
  if (!e.SerializeToString(&s)) throw Error("TensorBoard event: protobuf serialisation failed");
  return s;
}

// One record's framing around `payload` (event_file.h).
std::string tfrecord(const std::string& payload) {
  std::string r;
  r.reserve(payload.size() + 16);
  put_le(r, payload.size(), 8);
  put_le(r, masked_crc32c(r.data(), 8), 4);
  r += payload;
  put_le(r, masked_crc32c(payload.data(), payload.size()), 4);
  return r;
}

// Seconds for a new file's name that sort it after every event file already in `dir`.
int64_t next_file_seconds(const std::string& dir) {
  int64_t seconds = static_cast<int64_t>(now_s());
  const std::string prefix = "events.out.tfevents.";
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d))
      if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0)
        seconds = std::max<int64_t>(seconds, std::strtoll(e->d_name + prefix.size(), nullptr, 10) + 1);
    ::closedir(d);
  }
  return seconds;
}
}  // namespace

EventFile::EventFile(const std::string& run_dir) {
  char host[256] = "host";
  ::gethostname(host, sizeof(host) - 1);
  path_ = run_dir + "/events.out.tfevents." + std::to_string(next_file_seconds(run_dir)) + "." + host + ".multinorm";
  out_.open(path_, std::ios::binary | std::ios::app);
  if (!out_) throw Error(path_ + ": cannot create the TensorBoard event file: " + std::strerror(errno));
  tensorboard::Event e;
  e.set_wall_time(now_s());
  e.set_file_version("brain.Event:2");
  write(serialized(e), 0);
}

void EventFile::scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values) {
  tensorboard::Event e;
  e.set_wall_time(now_s());
  e.set_step(step);
  for (const auto& [tag, v] : values) {
    tensorboard::SummaryValue* sv = e.mutable_summary()->add_value();
    sv->set_tag(tag);
    sv->set_simple_value(static_cast<float>(v));
  }
  write(serialized(e), step);
}

void EventFile::restart_at(int64_t step) {
  tensorboard::Event e;
  e.set_wall_time(now_s());
  e.set_step(step);
  e.mutable_session_log()->set_status(tensorboard::SessionLog::START);
  write(serialized(e), step);
}

void EventFile::write(const std::string& event, int64_t step) {
  out_ << tfrecord(event) << std::flush;
  if (!out_) throw Error(path_ + ": write failed at update " + std::to_string(step) + " (disk full?)");
}

}  // namespace multinorm
