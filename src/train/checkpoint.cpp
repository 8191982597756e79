#include "multinorm/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "multinorm/error.h"
#include "multinorm/json_file.h"
#include "multinorm/model_io.h"
#include "multinorm/safetensors.h"

namespace multinorm {

namespace {
void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

void remove_tree(const std::string& dir) {
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n != "." && n != "..") ::unlink((dir + "/" + n).c_str());
    }
    ::closedir(d);
  }
  ::rmdir(dir.c_str());
}

}  // namespace

std::vector<std::string> checkpoint_dirs(const std::string& root) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(root.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n.rfind("step_", 0) == 0 && n.find('.') == std::string::npos) out.push_back(n);
    }
    ::closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string config_fingerprint(const RunConfig& run) {
  const json& r = run.resolved;
  json f = {{"model", r["model"]["config"]}, {"batch", r["batch"]}, {"optimizer", r["optimizer"]},
            {"precision", r["precision"]}, {"layout", r["data"]["layout"]}, {"seed", r["seed"]}};
  return f.dump();
}

std::string checkpoint_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step_%08lld", (long long)step);
  return name;
}

std::string write_checkpoint(const std::string& run_dir, const LlamaModel& model, const Optimizer& opt,
                             const TrainerState& state, int64_t keep_last) {
  const std::string root = run_dir + "/checkpoints";
  ::mkdir(root.c_str(), 0755);
  const std::string final_dir = root + "/" + checkpoint_name(state.step), tmp = final_dir + ".tmp";
  remove_tree(tmp);
  save_hf_model(model, tmp, model.dtype());
  const std::vector<uint8_t> states = opt.states_to_host();
  write_text_file_atomic(tmp + "/optimizer.bin", std::string(states.begin(), states.end()));
  json ts = {{"step", state.step},       {"tokens_seen", state.tokens_seen},  {"skipped_updates", state.skipped},
             {"skipped_in_a_row", state.skipped_in_a_row},
             {"cursor", state.cursor.to_json()}, {"fingerprint", state.fingerprint},
             {"optimizer_state_bytes", static_cast<int64_t>(states.size())}, {"param_dtype", dtype_name(model.dtype())}};
  write_text_file_atomic(tmp + "/trainer_state.json", ts.dump(2) + "\n");
  fsync_path(tmp);
  remove_tree(final_dir);  // a re-written step (resume from an earlier one) replaces it
  if (std::rename(tmp.c_str(), final_dir.c_str()) != 0)
    throw Error(final_dir + ": cannot publish checkpoint: " + std::strerror(errno));
  fsync_path(root);
  const auto all = checkpoint_dirs(root);
  for (size_t i = 0; i + static_cast<size_t>(keep_last) < all.size(); ++i) remove_tree(root + "/" + all[i]);
  return final_dir;
}

TrainerState read_checkpoint(const std::string& dir, LlamaModel& model, Optimizer* opt, const RunConfig& run) {
  const json ts = read_json_file(dir + "/trainer_state.json");
  TrainerState st;
  st.step = ts.at("step").get<int64_t>();
  st.tokens_seen = ts.at("tokens_seen").get<int64_t>();
  st.skipped = ts.value("skipped_updates", int64_t{0});
  st.skipped_in_a_row = ts.value("skipped_in_a_row", int64_t{0});
  st.cursor = LoaderCursor::from_json(ts.at("cursor"));
  st.fingerprint = ts.at("fingerprint").get<std::string>();
  if (opt) {
    const std::string mine = config_fingerprint(run);
    if (st.fingerprint != mine) {
      const json a = json::parse(st.fingerprint), b = json::parse(mine);
      std::string diff;
      for (auto it = a.begin(); it != a.end(); ++it)
        if (!b.contains(it.key()) || b[it.key()] != it.value()) diff += (diff.empty() ? "" : ", ") + it.key();
      throw ConfigError(dir + ": checkpoint of an incompatible run (" + diff +
                        " differ from the current config); resume with the config it was written with");
    }
  }
  if (ts.value("param_dtype", std::string(dtype_name(model.dtype()))) != dtype_name(model.dtype()))
    throw ConfigError(dir + ": weights stored as " + ts.value("param_dtype", std::string()) + ", the run uses " +
                      dtype_name(model.dtype()));
  load_hf_model(model, dir);  // refuses other shapes, naming the field
  if (opt) {
    const std::string bytes = read_text_file(dir + "/optimizer.bin");
    opt->states_from_host(std::vector<uint8_t>(bytes.begin(), bytes.end()));
  }
  return st;
}

}  // namespace multinorm
