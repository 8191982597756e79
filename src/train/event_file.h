// TensorBoard event files beside metrics.jsonl (log.tensorboard): `tensorboard --logdir runs/`
// and `wandb sync --sync-tensorboard RUN_DIR` read them. A file is a sequence of TFRecord records:
//   uint64 length | uint32 masked CRC-32C of those 8 bytes | length bytes | uint32 masked CRC-32C of them
// each holding one Event (tensorboard_event.proto). Each write is flushed and checked, as the
// metrics lines are: a full disk is an error naming the file.
#pragma once
#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace multinorm {

class EventFile {
 public:
  // Opens RUN_DIR/events.out.tfevents.<seconds>.<host>.multinorm, a new file per run of the
  // trainer, and writes the file-version record. TensorBoard reads a directory's files in the order
  // of their names: <seconds> is now, or one more than the newest file's already there.
  explicit EventFile(const std::string& run_dir);
  const std::string& path() const { return path_; }
  // Scalars of one step, as (tag, value).
  void scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values);
  // A session start at `step`: TensorBoard drops what earlier files logged at `step` and after (a
  // resume from update step - 1, or a rollback to it, redoes those updates).
  void restart_at(int64_t step);

 private:
  void write(const std::string& event, int64_t step);
  std::string path_;
  std::ofstream out_;
};

}  // namespace multinorm
