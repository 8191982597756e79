// The training loop. One update = `accum` micro-batches (global_batch / (micro_batch x world)),
// gradients accumulated in the model's gradient arena, then one optimizer step.
// Loss normalisation: micro_batch_mean (GaLore: every micro-batch's mean loss weighs the same,
// gradient scale 1 / (count x accum)) or token_mean (every counted target of the update weighs the
// same, scale 1 / total count).
#include "multinorm/trainer.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>

#include "multinorm/c4_reader.h"
#include "multinorm/checkpoint.h"
#include "multinorm/data_parallel.h"
#include "multinorm/divergence.h"
#include "multinorm/device.h"
#include "multinorm/memory_estimate.h"
#include "multinorm/error.h"
#include "multinorm/json_file.h"
#include "multinorm/model_io.h"
#include "multinorm/optimizer.h"
#include "multinorm/param_groups.h"
#include "multinorm/process_memory.h"
#include "multinorm/fault_points.h"
#include "multinorm/run_lock.h"
#include "multinorm/shard_plan.h"

namespace multinorm {

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

void mkdirs(const std::string& path) {
  std::string cur;
  for (size_t i = 0; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') {
      if (!cur.empty()) ::mkdir(cur.c_str(), 0755);
    }
    if (i < path.size()) cur += path[i];
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) throw Error(path + ": cannot create the run directory");
}

// Keeps metrics.jsonl lines up to `step` (a resumed run rewrites what came after its checkpoint), and
// every divergence trip.
void truncate_metrics(const std::string& path, int64_t step) {
  std::ifstream in(path);
  if (!in) return;
  std::string line, kept;
  while (std::getline(in, line)) {
    const json j = json::parse(line, nullptr, false);
    // Divergence trips stay: a rollback drops the updates it undid, not the record of why.
    if (!j.is_discarded() && (j.value("step", int64_t{0}) <= step || j.value("type", std::string()) == "divergence")) kept += line + "\n";
  }
  write_text_file_atomic(path, kept);
}

std::string format_eta(double s) {
  char buf[32];
  const int64_t t = static_cast<int64_t>(s);
  std::snprintf(buf, sizeof(buf), "%lld:%02lld:%02lld", (long long)(t / 3600), (long long)(t / 60 % 60), (long long)(t % 60));
  return buf;
}

}  // namespace

double EvalResult::perplexity() const { return std::exp(loss); }
double EvalResult::galore_perplexity() const { return std::exp(galore_loss); }

EvalResult evaluate(LlamaModel& model, std::shared_ptr<const ShardSet> data, int64_t micro_batch, int64_t token_budget,
                    Comm& comm) {
  EvalLoader loader(std::move(data), micro_batch, token_budget, comm.rank(), comm.size());
  double sums[3] = {0, 0, 0};  // sum of micro-batch means, micro-batches, counted tokens: over all ranks
  Batch b;
  while (loader.next(b)) {
    if (b.count == 0) continue;
    const LossSum l = model.forward(b.view());
    sums[0] += l.mean();
    sums[1] += 1;
    sums[2] += static_cast<double>(l.count);
  }
  comm.allreduce_sum(sums, 3);
  EvalResult r;
  r.batches = static_cast<int64_t>(sums[1]);
  r.tokens = static_cast<int64_t>(sums[2]);
  if (r.batches == 0) throw Error("eval: the validation data holds no counted target");
  r.loss = sums[0] / r.batches;
  r.galore_loss = sums[0] / (r.batches + 1);
  return r;
}

std::string latest_checkpoint(const std::string& run_dir) {
  const auto all = checkpoint_dirs(run_dir + "/checkpoints");
  return all.empty() ? "" : run_dir + "/checkpoints/" + all.back();
}

TrainResult train(const RunConfig& run, const TrainOptions& opt) {
  const auto t_start = Clock::now();
  TrainResult result;
  result.run_dir = run.output_dir;
  const BackendChoice choice = choose_backend(run.backend);
  // Data parallelism: every rank runs this same loop on its slice of each global step; rank 0 alone
  // writes the run directory (config, metrics, checkpoints) and logs.
  Comm& comm = Comm::world();
  comm.set_timeout(run.parallel.timeout_s);
  Comm::set_activity("start-up");
  const int world = comm.size(), rank = comm.rank();
  auto log = [&](const char* fmt, auto... args) {
    if (!opt.quiet && comm.root()) std::fprintf(stderr, fmt, args...);
  };
  // Run directory (locked by rank 0 for the run's life: one trainer per directory) and the resolved config.
  std::unique_ptr<RunDirLock> lock;
  if (comm.root()) {
    mkdirs(run.output_dir);
    lock = std::make_unique<RunDirLock>(run.output_dir);
    remove_stale_checkpoint_temporaries(run.output_dir);  // left by a trainer that died while writing one
  }
  comm.barrier();  // no rank reads the directory before rank 0 holds it
  const bool resume = opt.resume || !opt.resume_from.empty();
  if (!opt.resume_from.empty() && ::access((opt.resume_from + "/trainer_state.json").c_str(), F_OK) != 0) {
    const std::string newest = latest_checkpoint(opt.resume_from);
    throw Error("--resume-from " + opt.resume_from + ": not a checkpoint directory" +
                (newest.empty() ? std::string(" (no trainer_state.json)")
                                : ", but a run directory: pass one of its checkpoints, e.g. --resume-from " + newest + ", or --resume for its latest"));
  }
  const std::string existing = opt.resume_from.empty() ? latest_checkpoint(run.output_dir) : opt.resume_from;
  if (!existing.empty() && !resume)
    throw Error(run.output_dir + " already holds checkpoints (" + existing + "): pass --resume, or another output_dir");
  if (comm.root()) write_text_file_atomic(run.output_dir + "/config.json", run.resolved.dump(2) + "\n");

  if (run.data.train.empty()) throw ConfigError(run.source + ": data.train: no training shards configured");
  if (run.batch.global_batch % (run.batch.micro_batch * world) != 0)
    throw ConfigError(run.source + ": batch.global_batch " + std::to_string(run.batch.global_batch) +
                      " is not a multiple of batch.micro_batch x ranks = " + std::to_string(run.batch.micro_batch) +
                      " x " + std::to_string(world));
  const int64_t accum = run.batch.global_batch / (run.batch.micro_batch * world);
  if (run.eval.micro_batch > run.batch.micro_batch)
    throw ConfigError(run.source + ": eval.micro_batch " + std::to_string(run.eval.micro_batch) +
                      " exceeds batch.micro_batch " + std::to_string(run.batch.micro_batch));

  auto backend = make_backend(choice, static_cast<int>(run.threads));
  LlamaModel model(*backend, run.model, run.precision.params, run.batch.micro_batch, run.batch.seq_len,
                   run.precision.grads);
  model.set_graphs(run.cuda_graphs);
  if (run.model_init_from.empty()) model.init_random(static_cast<uint64_t>(run.seed));
  else {
    const auto verify = verify_reads_of(run.model_init_from);  // a checkpoint: its files checked as they are read
    load_hf_model(model, run.model_init_from);
  }
  // Data parallelism: gradients in buckets through the backend's communicator (MPI on host memory,
  // NCCL on a GPU), each tensor updated by its owner when the optimizer is sharded.
  std::unique_ptr<Communicator> grad_comm = make_gradient_communicator(*backend, comm);
  const ShardPlan plan =
      plan_shards(assign_optimizers(model.tensors(), run.optimizer), run, world, rank, run.parallel.shard_optimizer);
  Optimizer optimizer(model, run, OptimizerSharding{plan, grad_comm.get(), &comm});
  optimizer.set_graphs(run.cuda_graphs);
  GradientSync grad_sync(model, *grad_comm, plan, static_cast<int64_t>(run.parallel.bucket_mb * 1048576.0),
                         run.parallel.overlap, run.parallel.staging_buckets);

  auto train_data = std::make_shared<const ShardSet>(expand_globs(run.data.train), run.batch.seq_len, run.model.vocab_size);
  std::shared_ptr<const ShardSet> val_data;
  if (!run.data.validation.empty())
    val_data = std::make_shared<const ShardSet>(expand_globs(run.data.validation), run.batch.seq_len, run.model.vocab_size);
  // The data was made with the run's tokenizer, in its layout, for its vocabulary (errors name the shard).
  std::string data_note;
  const uint64_t tokenizer_hash = check_data_identity(*train_data, run.data.tokenizer, run.data.layout, run.model.vocab_size, &data_note);
  if (val_data) {
    const uint64_t v = check_data_identity(*val_data, run.data.tokenizer, run.data.layout, run.model.vocab_size);
    if (v != 0 && tokenizer_hash != 0 && v != tokenizer_hash)
      throw Error(run.data.validation + ": the validation shards were tokenized with another tokenizer than the training shards");
  }

  TrainerState state;
  state.fingerprint = config_fingerprint(run);
  state.tokenizer_hash = tokenizer_hash;
  if (!data_note.empty()) log("%s\n", data_note.c_str());
  if (resume && !existing.empty()) {
    try {
      state = read_checkpoint(existing, model, &optimizer, run, opt.allow_config_change);
    } catch (const CorruptFileError& e) {
      // Never falls back silently: the user picks the earlier checkpoint, by name.
      const auto all = checkpoint_dirs(run.output_dir + "/checkpoints");
      std::string previous;
      for (const std::string& d : all)
        if (run.output_dir + "/checkpoints/" + d != existing && d < existing.substr(existing.find_last_of('/') + 1))
          previous = run.output_dir + "/checkpoints/" + d;
      throw Error(std::string(e.what()) + "\n" +
                  (previous.empty() ? "no earlier checkpoint in " + run.output_dir + "/checkpoints"
                                    : "the previous checkpoint is " + previous + ": resume from it with --resume-from " + previous +
                                          " (multinorm checkpoint verify checks one)"));
    }
    if (state.tokenizer_hash != 0 && tokenizer_hash != 0 && state.tokenizer_hash != tokenizer_hash)
      throw Error(existing + ": written from data of another tokenizer than this run's (resume with the data it was trained on)");
    if (state.tokenizer_hash == 0) state.tokenizer_hash = tokenizer_hash;
    log("resumed from %s (update %lld)\n", existing.c_str(), (long long)state.step);
  }
  // Metrics past the checkpoint resumed from (or, starting afresh, any: a run that died before its
  // first checkpoint) are rewritten by this run.
  if (comm.root()) truncate_metrics(run.output_dir + "/metrics.jsonl", state.step);
  LoaderOptions lo;
  lo.micro_batch = run.batch.micro_batch;
  lo.rank = rank;
  lo.world = world;
  lo.shuffle = run.data.shuffle;
  lo.seed = static_cast<uint64_t>(run.seed);
  lo.prefetch = run.data.prefetch;
  std::unique_ptr<TrainLoader> loader_owner;
  try {
    loader_owner = std::make_unique<TrainLoader>(train_data, lo, state.cursor);
  } catch (const Error& e) {
    if (existing.empty() || !resume) throw;
    throw Error(existing + "/trainer_state.json: " + e.what() + " (edited, or the data changed since the checkpoint)");
  }

  const int64_t last = opt.max_updates > 0 ? std::min(opt.max_updates, run.schedule.total_steps) : run.schedule.total_steps;
  log("multinorm train: %s, %s, %s, %lld parameters, %s + %s (optimizer state %.1f MiB, %.1f MiB for the matrices)\n",
      run.name.c_str(), choice.reason.c_str(), comm_description(), (long long)model.num_params(), run.optimizer.name.c_str(),
      run.optimizer.fallback.c_str(), optimizer.state_bytes() / 1048576.0, optimizer.matrix_state_bytes() / 1048576.0);
  log("  %lld updates of %lld x %lld tokens (%lld micro-batches of %lld on each of %d rank(s)), loss normalisation %s, "
      "%s weights, %s gradients\n",
      (long long)run.schedule.total_steps, (long long)run.batch.global_batch, (long long)run.batch.seq_len,
      (long long)accum, (long long)run.batch.micro_batch, world, run.batch.loss_normalization.c_str(),
      dtype_name(run.precision.params), dtype_name(run.precision.grads));
  if (world > 1)
    log("  data parallel: %d ranks, gradients over %s in %d bucket(s) of ~%.0f MiB (FP32 staging %.2f MiB), %s; optimizer %s (state on this rank "
        "%.1f of %.1f MiB); collective timeout %.0f s\n",
        world, grad_comm->name().c_str(), grad_sync.buckets(), run.parallel.bucket_mb, grad_sync.staging_bytes() / 1048576.0,
        run.parallel.overlap ? "overlapped with the last micro-batch's backward" : "after the backward pass",
        plan.sharded() ? "sharded by tensor (ZeRO-1)" : "replicated", optimizer.local_state_bytes() / 1048576.0,
        optimizer.state_bytes() / 1048576.0, run.parallel.timeout_s);
  {
    const TrainingMemory tm = training_memory(run, choice.kind == BackendKind::Cuda);
    const auto gib = [](int64_t b) { return static_cast<double>(b) / (1ll << 30); };
    log("  memory plan (%s): weights %.3f + gradients %.3f + states %.3f + activations %.3f + backend scratch %.3f = %.3f GiB\n",
        tm.cuda ? "CUDA device" : "CPU host", gib(tm.weights), gib(tm.grads), gib(tm.states), gib(tm.activations), gib(tm.backend_scratch),
        gib(tm.total()));
  }
  // Deferred statistics (deferred_stats): the host queues each update's step behind its micro-batches
  // and reads its statistics one update later. Not where the host must decide before the step.
  std::string not_deferrable = optimizer.why_steps_cannot_be_queued();
  if (not_deferrable.empty() && run.divergence.action == "skip" && run.divergence.spike_factor > 0)
    not_deferrable = "divergence.action skip decides on a loss spike before the update's step";
  if (run.deferred_stats == "on" && !not_deferrable.empty())
    throw ConfigError(run.source + ": deferred_stats: on, but " + not_deferrable + " (set it to auto or off)");
  const bool deferred = run.deferred_stats == "on" || (run.deferred_stats == "auto" && not_deferrable.empty() && choice.kind == BackendKind::Cuda);
  log("  update statistics: %s\n", deferred ? "deferred (each update's loss and gradient norm are read after the next update's micro-batches are queued)"
                                            : (std::string("read before each step") + (not_deferrable.empty() ? "" : " (" + not_deferrable + ")")).c_str());
  std::ofstream metrics;  // rank 0's; the other ranks' stream stays closed and writes nothing
  if (comm.root()) metrics.open(run.output_dir + "/metrics.jsonl", std::ios::app);
  const bool tty = ::isatty(STDERR_FILENO) && !opt.quiet && comm.root();
  const bool token_mean = run.batch.loss_normalization == "token_mean";

  auto do_eval = [&](int64_t step) {
    if (!val_data) return;
    Comm::set_activity("the evaluation after update " + std::to_string(step));
    const auto t = Clock::now();
    result.eval = evaluate(model, val_data, run.eval.micro_batch, run.eval.tokens, comm);
    json e = {{"type", "eval"}, {"step", step}, {"val_loss", result.eval.loss}, {"val_ppl", result.eval.perplexity()},
              {"val_loss_galore", result.eval.galore_loss}, {"val_tokens", result.eval.tokens},
              {"seconds", since(t)}};
    metrics << e.dump() << "\n" << std::flush;
    if (comm.root() && !metrics) throw Error(run.output_dir + "/metrics.jsonl: write failed at the evaluation of update " + std::to_string(step) + " (disk full?)");
    log("%seval @ %lld: loss %.4f, perplexity %.2f over %lld tokens (GaLore's divisor: %.2f)\n", tty ? "\n" : "",
        (long long)step, result.eval.loss, result.eval.perplexity(), (long long)result.eval.tokens,
        result.eval.galore_perplexity());
  };
  auto do_checkpoint = [&]() {  // the ranks hold identical models; a sharded state is gathered on rank 0, which writes
    Comm::set_activity("the checkpoint of update " + std::to_string(state.step));
    // "The last good checkpoint" means finite weights: one reduction over the weights (on the device).
    const double weights_ss = backend->sum_squares(model.params(), model.num_params());
    if (!std::isfinite(weights_ss))
      throw Error("update " + std::to_string(state.step) + ": the weights are not finite; no checkpoint written. The last good checkpoint is " +
                  (result.last_checkpoint.empty() ? (existing.empty() ? std::string("none") : existing) : result.last_checkpoint));
    const std::vector<uint8_t> states = optimizer.states_to_host();
    if (comm.root())
      result.last_checkpoint = write_checkpoint(run.output_dir, model, states, state, run.checkpoint.keep_last, run);
    else
      result.last_checkpoint = run.output_dir + "/checkpoints/" + checkpoint_name(state.step);
    comm.barrier();  // no rank runs ahead of a checkpoint that is not on disk yet
  };

  // The divergence monitor (divergence.h): what a trip does. Stop: a metrics line, result.json says
  // diverged, DivergenceError (exit status 3). Rollback: the last good checkpoint's weights,
  // optimizer state and data position, the learning rate lowered; returns true, and the loop goes on
  // from the checkpoint's update.
  DivergenceMonitor monitor(run.divergence, std::log(static_cast<double>(run.model.vocab_size)));
  optimizer.set_lr_scale(state.lr_scale);
  const std::string metrics_path = run.output_dir + "/metrics.jsonl";
  auto on_trip = [&](const DivergenceTrip& trip, int64_t k) -> bool {
    const std::string good = result.last_checkpoint.empty() ? existing : result.last_checkpoint;
    const bool roll = run.divergence.action == "rollback" && state.rollbacks < run.divergence.max_rollbacks && !good.empty();
    const double scale = state.lr_scale * run.divergence.rollback_lr_factor;
    json d = {{"type", "divergence"}, {"step", k},          {"reason", trip.reason},
              {"value", trip.value},  {"threshold", trip.threshold}, {"action", roll ? "rollback" : "stop"}};
    if (!roll) {
      log("%supdate %lld: diverged: %s; stopping (divergence.action %s%s)\n", tty ? "\n" : "", (long long)k, trip.describe().c_str(),
          run.divergence.action.c_str(), run.divergence.action == "rollback" ? ", rollbacks used up or no checkpoint" : "");
      metrics << d.dump() << "\n" << std::flush;
      if (comm.root()) {
        json res = {{"diverged", true},         {"divergence", d},          {"updates", state.step},
                    {"last_good_checkpoint", good}, {"rollbacks", state.rollbacks}, {"optimizer", run.optimizer.name}};
        write_text_file_atomic(run.output_dir + "/result.json", res.dump(2) + "\n");
      }
      throw DivergenceError("update " + std::to_string(k) + " diverged: " + trip.describe() + "; the last good checkpoint is " +
                            (good.empty() ? std::string("none") : good) + " (metrics.jsonl and result.json record it)");
    }
    log("%supdate %lld: diverged: %s; rolling back to %s with the learning rate x %.4g (rollback %lld of %lld)\n", tty ? "\n" : "",
        (long long)k, trip.describe().c_str(), good.c_str(), scale, (long long)state.rollbacks + 1, (long long)run.divergence.max_rollbacks);
    const int64_t rollbacks = state.rollbacks + 1;
    state = read_checkpoint(good, model, &optimizer, run, /*allow_config_change=*/true);
    state.rollbacks = rollbacks;
    state.lr_scale = scale;
    optimizer.set_lr_scale(scale);
    monitor.reset();
    if (comm.root()) {  // the diverged updates' lines go; the trip's stays
      metrics.close();
      truncate_metrics(metrics_path, state.step);
      metrics.open(metrics_path, std::ios::app);
      d["rolled_back_to"] = state.step;
      metrics << d.dump() << "\n" << std::flush;
    }
    loader_owner = std::make_unique<TrainLoader>(train_data, lo, state.cursor);
    return true;
  };

  // One update's host-side record from the queuing of its micro-batches to the end of its bookkeeping.
  struct UpdateWork {
    int64_t k = 0;
    int64_t micro_batches = 0;  // queued, in order: their losses come back with the update
    LoaderCursor cursor;        // the data position once its batches are consumed
    Clock::time_point t_compute;
    double data_s = 0, compute_s = 0, opt_s = 0, comm_wait_s = 0, comm_exposed_s = 0, forward_s = 0, backward_s = 0;
    int64_t fence = 0;          // deferred: after its step and its statistics' copy
    double backward_end = 0;    // wall clock when this rank's backward pass was queued
  };
  // The update's data and micro-batches, queued with no host wait (the gradient reduction started).
  auto queue_micro_batches = [&](int64_t k) {
    UpdateWork w;
    w.k = k;
    Comm::set_activity("update " + std::to_string(k));
    const double wait_before = loader_owner->wait_seconds();
    std::vector<Batch> batches;
    int64_t total_count = 0;  // counted targets of the whole global step, all ranks
    for (int64_t a = 0; a < accum; ++a) {
      batches.push_back(loader_owner->next());
      total_count += batches.back().count;
    }
    comm.allreduce_sum(&total_count, 1);
    w.data_s = loader_owner->wait_seconds() - wait_before;
    w.cursor = batches.back().after;
    model.zero_grads();
    w.t_compute = Clock::now();
    int64_t last_counted = -1;  // the last micro-batch with a counted target: its backward pass starts the reduction
    for (int64_t a = 0; a < accum; ++a)
      if (batches[static_cast<size_t>(a)].count > 0) last_counted = a;
    for (int64_t a = 0; a < accum; ++a) {
      const Batch& b = batches[static_cast<size_t>(a)];
      if (b.count == 0) continue;
      if (a == last_counted) grad_sync.arm();
      // The gradient summed over the ranks must be the global step's: token mean divides by every
      // rank's counted targets, micro-batch mean by every rank's micro-batches.
      const float scale = token_mean ? 1.0f / static_cast<float>(total_count)
                                     : 1.0f / (static_cast<float>(b.count) * static_cast<float>(accum * world));
      model.queue_forward_backward(b.view(), scale);  // no host wait: the losses come with the update's statistics
      ++w.micro_batches;
    }
    w.forward_s = model.last_forward_seconds(), w.backward_s = model.last_backward_seconds();
    // When this rank's backward pass ended (wall clock: one clock for the ranks of a node, NTP's
    // across nodes): the latest over the ranks tells how much of this rank's communication wait was
    // waiting for a slower rank rather than for the collectives (metrics: comm_exposed_s).
    w.backward_end = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    w.compute_s = since(w.t_compute);
    return w;
  };
  // The rest of the update's gradient reduction, waited for (a host wait on NCCL's completion, with
  // the collective timeout).
  auto finish_reduction = [&](UpdateWork& w) {
    grad_sync.finish();
    double latest_backward_end = w.backward_end;
    if (world > 1) comm.allreduce_max(&latest_backward_end, 1);
    w.comm_wait_s = grad_sync.last_wait_seconds();
    w.comm_exposed_s = std::max(0.0, w.comm_wait_s - (latest_backward_end - w.backward_end));
  };
  // The update's loss over every rank from its micro-batches' queued losses (delivered by a wait).
  auto take_loss = [&](const UpdateWork& w, int64_t* counted_out) {
    double loss_sum = 0, mean_sum = 0;
    int64_t counted = 0, means = 0;
    for (const LossSum& l : model.take_queued_losses(w.micro_batches)) {
      loss_sum += l.sum;
      counted += l.count;
      mean_sum += l.mean();
      ++means;
    }
    double sums[4] = {loss_sum, mean_sum, static_cast<double>(counted), static_cast<double>(means)};
    comm.allreduce_sum(sums, 4);
    *counted_out = static_cast<int64_t>(sums[2]);
    return token_mean ? sums[0] / std::max<int64_t>(*counted_out, 1) : sums[1] / std::max<double>(sums[3], 1.0);
  };

  const auto t_loop = Clock::now();
  auto t_last_end = t_loop;  // when the previous update's bookkeeping ended: an update's step_s is the time since
  int64_t waits_mark = backend->host_synchronisations(), drains_mark = backend->host_drains();
  const int64_t first = state.step + 1;
  int64_t tokens_this_run = 0;
  int64_t swan_warnings = 0;  // updates whose Newton-Schulz did not converge
  // What follows an update's step: skip accounting, the metrics line, the log, evaluation and
  // checkpoint. True when a divergence trip rolled the run back (state is the checkpoint's then).
  auto record_update = [&](const UpdateWork& w, double loss, int64_t counted, const StepStats& st, bool finite,
                           bool spike_skipped) -> bool {
    const int64_t k = w.k;
    state.cursor = w.cursor;
    if (spike_skipped) {
      ++state.skipped;
    } else if (!finite) {
      // A non-finite loss or gradient norm: skipped (--skip-nonfinite or divergence.action skip), or
      // a divergence trip (stop, or rollback).
      const DivergenceTrip trip{std::isfinite(loss) ? "non-finite gradient norm" : "non-finite loss", std::isfinite(loss) ? st.grad_norm : loss, 0.0};
      const bool skip = opt.skip_nonfinite || run.divergence.action == "skip";
      if (!skip && on_trip(trip, k)) return true;
      ++state.skipped;
      ++state.skipped_in_a_row;
      log("%supdate %lld: %s, skipped (%lld so far, %lld in a row)\n", tty ? "\n" : "", (long long)k, trip.reason.c_str(),
          (long long)state.skipped, (long long)state.skipped_in_a_row);
      // Weights that went non-finite make every later update non-finite: stop instead of skipping
      // to the end and reporting a complete run. The skipped updates were never applied.
      if (state.skipped_in_a_row >= opt.max_consecutive_skips &&
          on_trip(DivergenceTrip{std::to_string(state.skipped_in_a_row) + " consecutive non-finite updates (--max-consecutive-skips)",
                                 static_cast<double>(state.skipped_in_a_row), static_cast<double>(opt.max_consecutive_skips)},
                  k))
        return true;
    } else {
      state.skipped_in_a_row = 0;
    }
    const bool skipped = !finite || spike_skipped;
    if (st.swan.tensors > 0 && st.swan.unconverged + st.swan.fallbacks > 0) {
      ++swan_warnings;
      if (swan_warnings == 1 || swan_warnings % 100 == 0)
        log("%swarning: update %lld: SWAN's Newton-Schulz did not reach optimizer.swan.ns_tolerance %.1e in %lld "
            "steps on %lld of %lld tensors (worst residual %.2e, %lld fell back to the exact path); %lld updates so far. "
            "Raise optimizer.swan.ns_steps or use whitening=eigh.\n",
            tty ? "\n" : "", (long long)k, run.optimizer.swan.ns_tolerance, (long long)run.optimizer.swan.ns_steps,
            (long long)st.swan.unconverged, (long long)st.swan.tensors, st.swan.worst_residual,
            (long long)st.swan.fallbacks, (long long)swan_warnings);
    }
    state.step = k;
    const int64_t raw = accum * world * run.batch.micro_batch * run.batch.seq_len;
    state.tokens_seen += raw;
    tokens_this_run += raw;
    const double step_s = std::chrono::duration<double>(Clock::now() - t_last_end).count();
    result.last_loss = loss;
    // RSS counts the token shards' mapped pages, which grow as the run reads more of its data (and
    // which the kernel may drop); the anonymous part is the process's own memory.
    const ProcessMemory mem = process_memory();
    json m = {{"type", "train"},          {"step", k},
              {"loss", loss},             {"lr_matrix", st.lr_matrix},
              {"lr_fallback", st.lr_fallback}, {"grad_norm", st.grad_norm},
              {"clipped", st.clipped},    {"skipped", skipped},
              {"tokens", state.tokens_seen}, {"tokens_per_s", raw / step_s},
              {"nonpad_tokens_per_s", counted / step_s}, {"step_s", step_s},
              {"forward_s", w.forward_s}, {"backward_s", w.backward_s},
              {"compute_s", w.compute_s}, {"optimizer_s", w.opt_s},
              {"data_wait_s", w.data_s},  {"comm_wait_s", w.comm_wait_s},
              {"comm_exposed_s", w.comm_exposed_s},
              {"host_waits", backend->host_synchronisations() - waits_mark},
              {"host_drains", backend->host_drains() - drains_mark},
              {"rss_bytes", mem.resident_bytes},
              {"rss_anon_bytes", mem.anonymous_bytes()}};
    if (st.swan.tensors > 0) {
      m["swan_ns_residual"] = st.swan.worst_residual;  // worst over the update's tensors
      m["swan_ns_unconverged"] = st.swan.unconverged;
      m["swan_exact_fallbacks"] = st.swan.fallbacks;
    }
    // Flushed now, before the checkpoint that covers it is published (a kill between the two would
    // lose the line for good: a resume keeps the lines up to its checkpoint), and checked at once.
    metrics << m.dump() << "\n" << std::flush;
    if (comm.root() && !metrics) throw Error(run.output_dir + "/metrics.jsonl: write failed at update " + std::to_string(k) + " (disk full?)");
    fault_point("metrics-written");
    const double elapsed = since(t_loop), eta = elapsed / (k - first + 1) * (last - k);
    if (tty) {
      std::fprintf(stderr, "\r[%5.1f%%] update %lld/%lld  loss %.4f  lr %.2e/%.2e  |g| %.3f  %.0f tok/s  ETA %s   ",
                   100.0 * k / last, (long long)k, (long long)last, loss, st.lr_matrix, st.lr_fallback, st.grad_norm,
                   raw / step_s, format_eta(eta).c_str());
    } else if (!opt.quiet && (k % run.log_every == 0 || k == last)) {
      std::fprintf(stderr,
                   "update %lld/%lld loss %.4f lr %.3e/%.3e grad_norm %.4f tok/s %.0f (non-pad %.0f) step %.3fs "
                   "(fwd %.3f bwd %.3f opt %.3f data %.3f) rss %.0f MiB (anon %.0f) ETA %s\n",
                   (long long)k, (long long)last, loss, st.lr_matrix, st.lr_fallback, st.grad_norm, raw / step_s,
                   counted / step_s, step_s, w.forward_s, w.backward_s, w.opt_s, w.data_s,
                   mem.resident_bytes / 1048576.0, mem.anonymous_bytes() / 1048576.0, format_eta(eta).c_str());
    }
    const bool end = k == last;
    if ((run.eval.every > 0 && k % run.eval.every == 0) || (end && k == run.schedule.total_steps)) {
      do_eval(k);
      // Stuck at ln V: the validation loss, or without validation data the training loss.
      if (const auto trip = monitor.check_eval(val_data ? result.eval.loss : loss))
        if (on_trip(*trip, k)) return true;
    }
    if ((run.checkpoint.every > 0 && k % run.checkpoint.every == 0) || end) do_checkpoint();
    ++result.updates;
    t_last_end = Clock::now();
    waits_mark = backend->host_synchronisations(), drains_mark = backend->host_drains();
    return false;
  };

  if (deferred) {
    // Update k's step is queued right behind its micro-batches; its statistics (loss, norm, flags)
    // are read after update k + 1's micro-batches are queued, so the device never waits for the host
    // between updates. Everything the host decides on update k (a divergence trip, a skip's count,
    // the metrics line, an evaluation, a checkpoint) comes before update k + 1's step is queued: k + 1's
    // micro-batches read the weights and write only gradients, which a rollback zeroes anyway. With
    // data parallelism this happens while k + 1's backward pass and reduction run, and the host then
    // waits for the reduction (every rank takes the same decisions: the statistics are global).
    std::optional<UpdateWork> pending;
    int64_t k = first;
    while (true) {
      const bool more = k <= last;
      UpdateWork next;
      if (more) next = queue_micro_batches(k);
      if (pending) {
        UpdateWork w = *pending;
        pending.reset();
        Comm::set_activity("the statistics of update " + std::to_string(w.k));
        backend->wait_for_fence(w.fence);  // not a drain: update k's micro-batches are queued behind it
        int64_t counted = 0;
        const double loss = take_loss(w, &counted);
        const StepStats st = optimizer.queued_step_stats();
        // The device skipped the update when its norm was not finite. A non-finite loss always makes
        // the norm non-finite (a non-finite logit gives its row of the loss gradient NaNs, and the
        // lm_head gradient with them); were it ever not so, the update has been applied: a trip.
        bool finite = std::isfinite(loss) && !st.skipped, rolled_back = false;
        if (!std::isfinite(loss) && !st.skipped)
          rolled_back = on_trip(DivergenceTrip{"non-finite loss with a finite gradient norm (applied: deferred_stats)", loss, 0.0}, w.k);
        else if (finite)
          if (const auto trip = monitor.check_loss(loss)) rolled_back = on_trip(*trip, w.k);
        if (!rolled_back && finite)
          if (const auto trip = monitor.check_grad_norm(st.grad_norm)) rolled_back = on_trip(*trip, w.k);
        if (!rolled_back) rolled_back = record_update(w, loss, counted, st, finite, false);
        if (rolled_back) {
          if (more) {  // update k's micro-batches: their reduction completed, their losses dropped, their gradients zeroed next
            finish_reduction(next);
            model.take_queued_losses();
          }
          k = state.step + 1;
          continue;
        }
      }
      if (!more) break;
      finish_reduction(next);
      const auto t_opt = Clock::now();
      optimizer.queue_step(k, k - state.skipped);  // the skipped count covers every update before k
      next.fence = backend->fence();
      next.opt_s = since(t_opt);
      pending = next;
      ++k;
    }
  } else {
    for (int64_t k = first; k <= last; ++k) {
      UpdateWork w = queue_micro_batches(k);
      finish_reduction(w);
      // The update's one host wait: its statistics (norm, clip factor, skip flag), which brings the queued losses.
      optimizer.measure_gradient_norm(k);
      int64_t counted = 0;
      const double loss = take_loss(w, &counted);
      w.compute_s = since(w.t_compute);
      state.cursor = w.cursor;
      const auto t_opt = Clock::now();
      StepStats st;
      bool finite = std::isfinite(loss), spike_skipped = false;
      if (finite)
        if (const auto trip = monitor.check_loss(loss)) {
          if (run.divergence.action == "skip") {
            spike_skipped = true;
            log("%supdate %lld: %s; the update is skipped (divergence.action skip)\n", tty ? "\n" : "", (long long)k, trip->describe().c_str());
            metrics << json{{"type", "divergence"}, {"step", k}, {"reason", trip->reason}, {"value", trip->value},
                            {"threshold", trip->threshold}, {"action", "skip"}}.dump()
                    << "\n";
          } else if (on_trip(*trip, k)) {
            k = state.step;  // rolled back: on from the checkpoint's next update
            continue;
          }
        }
      if (finite && !spike_skipped) {
        st = optimizer.step(k, k - state.skipped);
        finite = !st.skipped;
        if (finite)
          if (const auto trip = monitor.check_grad_norm(st.grad_norm))
            if (on_trip(*trip, k)) {
              k = state.step;
              continue;
            }
      }
      w.opt_s = since(t_opt);
      if (record_update(w, loss, counted, st, finite, spike_skipped)) k = state.step;
    }
  }
  if (tty) std::fprintf(stderr, "\n");
  if (model.graph_captures() > 0)
    log("  CUDA graphs: %lld capture(s), %lld micro-batches replayed%s\n", (long long)model.graph_captures(),
        (long long)(backend->graph_replays() - optimizer.graph_replays()),
        model.graphs_turned_off() ? "; turned off: the loss scale changed before a capture was reused "
                                    "(token_mean, or micro_batch_mean over padded batches)" : "");
  if (optimizer.graph_captures() > 0)
    log("  CUDA graphs: the optimizer's update %lld capture(s), %lld updates replayed\n", (long long)optimizer.graph_captures(),
        (long long)optimizer.graph_replays());
  result.skipped = state.skipped;
  result.seconds = since(t_start);
  result.tokens_per_s = tokens_this_run / std::max(since(t_loop), 1e-9);
  if (state.step == run.schedule.total_steps && comm.root()) {  // complete: sweeps skip it from now on
    json res = {{"diverged", false}, {"rollbacks", state.rollbacks}, {"updates", state.step}, {"tokens", state.tokens_seen}, {"skipped_updates", state.skipped},
                {"tokens_per_s", result.tokens_per_s}, {"wall_s", result.seconds}, {"final_train_loss", result.last_loss},
                {"optimizer", run.optimizer.name}, {"optimizer_state_bytes", optimizer.state_bytes()},
                {"matrix_state_bytes", optimizer.matrix_state_bytes()}};
    if (result.eval.batches) res["final_val_loss"] = result.eval.loss, res["final_val_ppl"] = result.eval.perplexity();
    write_text_file_atomic(run.output_dir + "/result.json", res.dump(2) + "\n");
  }
  return result;
}

}  // namespace multinorm
