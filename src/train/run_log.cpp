// The run log (run_log.h): metrics.jsonl, the progress line, the text log.
#include "run_log.h"

#include <unistd.h>

#include "multinorm/error.h"
#include "multinorm/fault_points.h"
#include "multinorm/json_file.h"
#include "multinorm/process_memory.h"

namespace multinorm {

namespace {
std::string format_eta(double s) {
  char buf[32];
  const int64_t t = static_cast<int64_t>(s);
  std::snprintf(buf, sizeof(buf), "%lld:%02lld:%02lld", (long long)(t / 3600), (long long)(t / 60 % 60), (long long)(t % 60));
  return buf;
}
}  // namespace

RunLog::RunLog(const std::string& run_dir, bool root, bool quiet, int64_t log_every, int64_t last_update, bool tensorboard)
    : run_dir_(run_dir), path_(run_dir + "/metrics.jsonl"), root_(root), talk_(root && !quiet), tty_(talk_ && ::isatty(STDERR_FILENO)),
      log_every_(log_every), last_(last_update) {
  if (root_) metrics_.open(path_, std::ios::app);
  if (root_ && tensorboard) events_ = std::make_unique<EventFile>(run_dir);
}

RunLog::~RunLog() { end(); }

void RunLog::end() {
  if (progress_up_) std::fputc('\n', stderr);
  progress_up_ = false;
}

// Flushed at once, before the checkpoint that covers it is published (a kill between the two
// would lose the line for good: a resume keeps the lines up to its checkpoint), and checked.
void RunLog::write(const json& line, const std::string& what) {
  if (!root_) return;
  metrics_ << line.dump() << "\n" << std::flush;
  if (!metrics_) throw Error(path_ + ": write failed at " + what + " (disk full?)");
}

void RunLog::update(int64_t k, const UpdateRecord& r) {
  const StepStats& st = *r.stats;
  // RSS counts the token shards' mapped pages, which grow as the run reads more of its data (and
  // which the kernel may drop); the anonymous part is the process's own memory.
  const ProcessMemory mem = process_memory();
  json m = {{"type", "train"},          {"step", k},
            {"loss", st.loss},          {"lr_matrix", st.lr_matrix},
            {"lr_fallback", st.lr_fallback}, {"grad_norm", st.grad_norm},
            {"clipped", st.clipped},    {"skipped", st.skipped},
            {"tokens", r.tokens_seen},  {"tokens_per_s", r.raw_tokens / r.step_s},
            {"nonpad_tokens_per_s", st.tokens / r.step_s}, {"step_s", r.step_s},
            {"forward_s", r.times.forward_s}, {"backward_s", r.times.backward_s},
            {"compute_s", r.times.compute_s}, {"optimizer_s", r.times.optimizer_s},
            {"data_wait_s", r.times.data_wait_s}, {"comm_wait_s", r.times.comm_wait_s},
            {"comm_exposed_s", r.times.comm_exposed_s},
            {"host_waits", r.waits.host_waits}, {"host_drains", r.waits.host_drains},
            {"rss_bytes", mem.resident_bytes}, {"rss_anon_bytes", mem.anonymous_bytes()}};
  if (st.swan.tensors > 0) {
    m["swan_ns_residual"] = st.swan.worst_residual;  // worst over the update's tensors
    m["swan_ns_unconverged"] = st.swan.unconverged;
    m["swan_exact_fallbacks"] = st.swan.fallbacks;
    m["swan_ns_steps"] = st.swan.steps;  // the most iterations one tensor applied
  }
  write(m, "update " + std::to_string(k));
  if (events_)
    events_->scalars(k, {{"train/loss", st.loss}, {"train/lr_matrix", st.lr_matrix}, {"train/lr_fallback", st.lr_fallback},
                         {"train/grad_norm", st.grad_norm}, {"train/tokens_per_s", r.raw_tokens / r.step_s}});
  fault_point("metrics-written");
  if (!talk_) return;
  if (tty_) {
    std::fprintf(stderr, "\r[%5.1f%%] update %lld/%lld  loss %.4f  lr %.2e/%.2e  |g| %.3f  %.0f tok/s  ETA %s   ", 100.0 * k / last_,
                 (long long)k, (long long)last_, st.loss, st.lr_matrix, st.lr_fallback, st.grad_norm, r.raw_tokens / r.step_s,
                 format_eta(r.eta_s).c_str());
    progress_up_ = true;
  } else if (k % log_every_ == 0 || k == last_) {
    std::fprintf(stderr,
                 "update %lld/%lld loss %.4f lr %.3e/%.3e grad_norm %.4f tok/s %.0f (non-pad %.0f) step %.3fs "
                 "(fwd %.3f bwd %.3f opt %.3f data %.3f) rss %.0f MiB (anon %.0f) ETA %s\n",
                 (long long)k, (long long)last_, st.loss, st.lr_matrix, st.lr_fallback, st.grad_norm, r.raw_tokens / r.step_s,
                 st.tokens / r.step_s, r.step_s, r.times.forward_s, r.times.backward_s, r.times.optimizer_s, r.times.data_wait_s, mem.resident_bytes / 1048576.0,
                 mem.anonymous_bytes() / 1048576.0, format_eta(r.eta_s).c_str());
  }
}

void RunLog::evaluation(int64_t k, const EvalResult& e, double seconds) {
  write(json{{"type", "eval"}, {"step", k}, {"val_loss", e.loss}, {"val_ppl", e.perplexity()}, {"val_loss_galore", e.galore_loss},
             {"val_tokens", e.tokens}, {"seconds", seconds}},
        "the evaluation of update " + std::to_string(k));
  if (events_) events_->scalars(k, {{"eval/loss", e.loss}, {"eval/perplexity", e.perplexity()}});
  say("eval @ %lld: loss %.4f, perplexity %.2f over %lld tokens (GaLore's divisor: %.2f)\n", (long long)k, e.loss, e.perplexity(),
      (long long)e.tokens, e.galore_perplexity());
}

void RunLog::divergence(const json& line) { write(line, "update " + std::to_string(line.value("step", int64_t{0})) + "'s divergence record"); }

void RunLog::result(const json& r) {
  if (root_) write_text_file_atomic(run_dir_ + "/result.json", r.dump(2) + "\n");
}

void RunLog::rewind_to(int64_t step) {
  if (!root_) return;
  metrics_.close();
  std::ifstream in(path_);
  std::string line, kept;
  while (in && std::getline(in, line)) {
    const json j = json::parse(line, nullptr, false);
    if (!j.is_discarded() && (j.value("step", int64_t{0}) <= step || j.value("type", std::string()) == "divergence")) kept += line + "\n";
  }
  in.close();
  write_text_file_atomic(path_, kept);
  metrics_.open(path_, std::ios::app);
  if (events_) events_->restart_at(step + 1);
}

}  // namespace multinorm
