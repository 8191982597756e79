#include "multinorm/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>

#include "multinorm/checksum.h"
#include "multinorm/error.h"
#include "multinorm/fault_points.h"
#include "multinorm/json_file.h"
#include "multinorm/model_io.h"
#include "multinorm/safetensors.h"

namespace multinorm {

namespace {

// What a checkpoint holds; its manifest.json lists each with its size and CRC-32C.
const char* const kCheckpointFiles[] = {"model.safetensors", "config.json", "optimizer.bin", "trainer_state.json", "run_config.json"};
constexpr const char* kManifestFormat = "multinorm checkpoint manifest 1";
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

void remove_stale_checkpoint_temporaries(const std::string& run_dir) {
  const std::string root = run_dir + "/checkpoints";
  if (DIR* d = ::opendir(root.c_str())) {
    std::vector<std::string> stale;
    while (dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n.rfind("step_", 0) == 0 && n.find(".tmp") != std::string::npos) stale.push_back(n);
    }
    ::closedir(d);
    for (const std::string& n : stale) remove_tree(root + "/" + n);
  }
}

std::string config_fingerprint(const RunConfig& run) {
  const json& r = run.resolved;
  json batch = r["batch"];
  if (run.batch.loss_normalization == LossNormalization::TokenMean) batch.erase("micro_batch");
  json f = {{"model", r["model"]["config"]}, {"batch", batch},          {"optimizer", used_optimizer_settings(r["optimizer"])},
            {"schedule", r["schedule"]},      {"precision", r["precision"]}, {"layout", r["data"]["layout"]},
            {"seed", r["seed"]}};
  return f.dump();
}

namespace {
void flatten(const json& j, const std::string& prefix, std::map<std::string, std::string>& out) {
  if (j.is_object() && !j.empty()) {
    for (auto it = j.begin(); it != j.end(); ++it) flatten(it.value(), prefix.empty() ? it.key() : prefix + "." + it.key(), out);
  } else {
    out[prefix] = j.dump();
  }
}

// Whether a flattened fingerprint holds the object a key sits in ("optimizer.swan" for
// "optimizer.swan.ns_steps"; the whole fingerprint for a top-level key).
bool holds_parent(const std::map<std::string, std::string>& f, const std::string& key) {
  const size_t dot = key.rfind('.');
  if (dot == std::string::npos) return !f.empty();
  const std::string prefix = key.substr(0, dot + 1);
  const auto it = f.lower_bound(prefix);
  return it != f.end() && it->first.compare(0, prefix.size(), prefix) == 0;
}
}  // namespace

std::vector<std::string> fingerprint_diff(const std::string& stored, const std::string& current) {
  std::map<std::string, std::string> a, b;
  flatten(json::parse(stored), "", a);
  flatten(json::parse(current), "", b);
  // A key one side holds alone differs only where the other holds the object it sits in: an object
  // left out (the settings of an optimizer one run does not use) or new in a later version is not a
  // difference, and micro_batch (left out under token_mean) is none either way.
  std::vector<std::string> out;
  for (const auto& [k, v] : a) {
    const auto it = b.find(k);
    if (it != b.end() ? it->second != v : k != "batch.micro_batch" && holds_parent(b, k))
      out.push_back(k + ": " + v + " -> " + (it != b.end() ? it->second : "(unset)"));
  }
  for (const auto& [k, v] : b)
    if (!a.count(k) && k != "batch.micro_batch" && holds_parent(a, k)) out.push_back(k + ": (unset) -> " + v);
  return out;
}

std::string checkpoint_run_config_path(const std::string& dir) {
  const std::string own = dir + "/run_config.json", legacy = dir + "/../../config.json";
  for (const std::string& p : {own, legacy})
    if (::access(p.c_str(), R_OK) == 0) return p;
  throw Error(dir + ": no run config (neither " + own + " nor, for older checkpoints, " + legacy + ")");
}

std::string checkpoint_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step_%08lld", (long long)step);
  return name;
}

std::string write_checkpoint(const std::string& run_dir, const ParamStore& params, const std::vector<uint8_t>& states,
                             const TrainerState& state, int64_t keep_last, const RunConfig& run) {
  const std::string root = run_dir + "/checkpoints";
  ::mkdir(root.c_str(), 0755);
  // A temporary name of this process's own: two writers never share one (run_lock.h keeps a second
  // trainer out of the directory; this keeps even a stray one from mixing files into ours).
  const std::string final_dir = root + "/" + checkpoint_name(state.step), tmp = final_dir + ".tmp." + std::to_string(::getpid());
  remove_tree(tmp);
  save_hf_model(params, run.model, tmp, params.dtype());
  write_text_file_atomic(tmp + "/optimizer.bin", std::string(states.begin(), states.end()));
  json ts = {{"step", state.step},       {"tokens_seen", state.tokens_seen},  {"skipped_updates", state.skipped},
             {"skipped_in_a_row", state.skipped_in_a_row},
             {"cursor", state.cursor.to_json()}, {"fingerprint", state.fingerprint},
             {"optimizer_state_bytes", static_cast<int64_t>(states.size())}, {"param_dtype", dtype_name(params.dtype())},
             {"tokenizer_hash", std::to_string(state.tokenizer_hash)}, {"lr_scale", state.lr_scale}, {"rollbacks", state.rollbacks}};
  write_text_file_atomic(tmp + "/trainer_state.json", ts.dump(2) + "\n");
  write_text_file_atomic(tmp + "/run_config.json", run.resolved.dump(2) + "\n");
  // The manifest last: every file's size and CRC-32C (checksum.h). A directory without a complete
  // one is not a checkpoint (read_manifest).
  json files = json::object();
  for (const char* f : kCheckpointFiles) {
    uint64_t bytes = 0;
    const uint32_t crc = crc32c_file(tmp + "/" + f, &bytes);
    files[f] = {{"bytes", bytes}, {"checksum", crc32c_name(crc)}};
  }
  write_text_file_atomic(tmp + "/manifest.json", json{{"format", kManifestFormat}, {"files", files}}.dump(2) + "\n");
  fsync_path(tmp);
  fault_point("checkpoint-written");
  remove_tree(final_dir);  // a re-written step (resume from an earlier one) replaces it
  if (std::rename(tmp.c_str(), final_dir.c_str()) != 0)
    throw Error(final_dir + ": cannot publish checkpoint: " + std::strerror(errno));
  fsync_path(root);
  fault_point("checkpoint-published");
  const auto all = checkpoint_dirs(root);
  for (size_t i = 0; i + static_cast<size_t>(keep_last) < all.size(); ++i) remove_tree(root + "/" + all[i]);
  return final_dir;
}

std::map<std::string, ExpectedFile> read_manifest(const std::string& dir) {
  const std::string path = dir + "/manifest.json";
  if (::access(path.c_str(), F_OK) != 0)
    throw CorruptFileError(dir + ": no manifest.json: not a complete checkpoint (a crash while it was written, or a multinorm "
                           "older than checkpoint checksums)");
  json m;
  try {
    m = json::parse(read_text_file(path));
  } catch (const json::exception& e) {
    throw CorruptFileError(path + ": damaged (" + e.what() + ")");
  }
  if (m.value("format", std::string()) != kManifestFormat || !m.contains("files") || !m["files"].is_object())
    throw CorruptFileError(path + ": not a multinorm checkpoint manifest");
  std::map<std::string, ExpectedFile> out;
  for (const char* f : kCheckpointFiles) {
    if (!m["files"].contains(f)) throw CorruptFileError(path + ": lists no " + f);
    const json& e = m["files"][f];
    const std::string sum = e.value("checksum", std::string());
    ExpectedFile x;
    x.bytes = e.value("bytes", uint64_t{0});
    if (sum.rfind("crc32c:", 0) != 0 || sum.size() != 15) throw CorruptFileError(path + ": " + f + ": checksum '" + sum + "' is not crc32c:<8 hex digits>");
    x.crc = static_cast<uint32_t>(std::stoul(sum.substr(7), nullptr, 16));
    out[dir + "/" + f] = x;
  }
  return out;
}

std::vector<CheckedFile> verify_checkpoint(const std::string& dir) {
  std::vector<CheckedFile> out;
  for (const auto& [path, e] : read_manifest(dir)) {
    CheckedFile c;
    c.path = path;
    c.expected = e;
    c.crc = crc32c_file(path, &c.bytes);
    if (c.bytes != e.bytes || c.crc != e.crc)
      throw CorruptFileError(path + " is damaged: " + std::to_string(c.bytes) + " bytes with " + crc32c_name(c.crc) + ", the manifest of " + dir +
                             " recorded " + std::to_string(e.bytes) + " bytes with " + crc32c_name(e.crc));
    out.push_back(c);
  }
  return out;
}

std::unique_ptr<ExpectedChecksums> verify_reads_of(const std::string& dir) {
  if (::access((dir + "/manifest.json").c_str(), F_OK) != 0) return nullptr;  // a Hugging Face directory, not a checkpoint
  return std::make_unique<ExpectedChecksums>(read_manifest(dir), dir);
}

TrainerState read_checkpoint(const std::string& dir, ParamStore& params, Optimizer* opt, const RunConfig& run,
                             bool allow_config_change) {
  // Every file is checked against the manifest as it is read (one pass over each); the small files
  // this does not read are checked after. Only a resume reads (and checks) optimizer.bin.
  ExpectedChecksums verify(read_manifest(dir), dir);
  const json ts = read_json_file(dir + "/trainer_state.json");
  TrainerState st;
  st.step = ts.at("step").get<int64_t>();
  st.tokens_seen = ts.at("tokens_seen").get<int64_t>();
  st.skipped = ts.value("skipped_updates", int64_t{0});
  st.skipped_in_a_row = ts.value("skipped_in_a_row", int64_t{0});
  st.cursor = LoaderCursor::from_json(ts.at("cursor"));
  st.fingerprint = ts.at("fingerprint").get<std::string>();
  st.tokenizer_hash = std::stoull(ts.value("tokenizer_hash", std::string("0")));
  st.lr_scale = ts.value("lr_scale", 1.0);
  st.rollbacks = ts.value("rollbacks", int64_t{0});
  if (opt) {
    const std::string mine = config_fingerprint(run);
    const std::vector<std::string> diff = fingerprint_diff(st.fingerprint, mine);
    if (!diff.empty()) {
      std::string lines;
      for (const auto& d : diff) lines += "\n  " + d;
      if (!allow_config_change)
        throw ConfigError(dir + ": the run config differs from the checkpoint's (checkpoint -> now):" + lines +
                          "\nresume with the config it was written with, or pass --allow-config-change to accept this");
      std::fprintf(stderr, "resuming %s with a changed config (checkpoint -> now):%s\n", dir.c_str(), lines.c_str());
    }
    st.fingerprint = mine;
  }
  if (ts.value("param_dtype", std::string(dtype_name(params.dtype()))) != dtype_name(params.dtype()))
    throw ConfigError(dir + ": weights stored as " + ts.value("param_dtype", std::string()) + ", the run uses " +
                      dtype_name(params.dtype()));
  load_hf_model(params, run.model, dir);  // refuses other shapes, naming the field
  if (opt) {
    const std::string bytes = read_text_file(dir + "/optimizer.bin");
    opt->states_from_host(std::vector<uint8_t>(bytes.begin(), bytes.end()));
  }
  for (const std::string& path : verify.unread())
    if (opt || path != dir + "/optimizer.bin") read_text_file(path);  // checked as it is read
  return st;
}

}  // namespace multinorm
