// A training run's set-up and its updates' three steps (training_run.h); each update's device work
// is the UpdatePipeline's (update_pipeline.h). Data parallelism: every rank runs the same code on
// its slice of each global step; rank 0 alone writes the run directory (config, metrics,
// checkpoints) and logs.
#include "training_run.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "multinorm/c4_reader.h"
#include "multinorm/error.h"
#include "multinorm/json_file.h"
#include "multinorm/memory_estimate.h"
#include "multinorm/model_io.h"
#include "multinorm/param_groups.h"
#include "multinorm/shard_plan.h"

namespace multinorm {

namespace {

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

TrainingRun::TrainingRun(const RunConfig& run, const TrainOptions& opt)
    : run_(run), opt_(opt), comm_(Comm::world()), choice_(choose_backend(run.backend)), world_(comm_.size()), rank_(comm_.rank()),
      monitor_(run.divergence, std::log(static_cast<double>(run.model.vocab_size))), t_start_(Clock::now()) {
  comm_.set_timeout(run.parallel.timeout_s);
  Comm::set_activity("start-up");
  check_config();
  open_data();
  take_run_directory();
  build_model_and_optimizer();
  log_ = std::make_unique<RunLog>(run_.output_dir, comm_.root(), opt_.quiet, run_.log_every, last_, run_.log_tensorboard);
  resume();
  describe();
}

TrainingRun::~TrainingRun() = default;

// The cross-key rules that need the rank count.
void TrainingRun::check_config() const {
  if (run_.data.train.empty()) throw ConfigError(run_.source + ": data.train: no training shards configured");
  check_batch_over_ranks(run_, world_);
  if (run_.eval.micro_batch > run_.batch.micro_batch)
    throw ConfigError(run_.source + ": eval.micro_batch " + std::to_string(run_.eval.micro_batch) + " exceeds batch.micro_batch " +
                      std::to_string(run_.batch.micro_batch));
}

// The files of data.train or data.validation: none is an error naming the config, the key and what
// makes shards. Relative paths resolve against the working directory (docs/configs.md).
std::vector<std::string> TrainingRun::shard_files(const char* key, const std::string& globs) const {
  try {
    return expand_globs(globs);
  } catch (const Error& e) {
    char cwd[4096] = "?";
    if (!::getcwd(cwd, sizeof(cwd))) cwd[0] = '?', cwd[1] = 0;
    throw ConfigError(run_.source + ": " + key + ": " + e.what() + " (relative to the working directory " + cwd +
                      "): make the shards with `multinorm data tokenize` (docs/training-on-c4.md), or set " + key);
  }
}

// The shards, made with the run's tokenizer, in its layout, for its vocabulary (errors name the shard).
void TrainingRun::open_data() {
  if (!run_.data.tokenizer.empty() && ::access(run_.data.tokenizer.c_str(), R_OK) != 0)
    throw ConfigError(run_.source + ": data.tokenizer: " + run_.data.tokenizer +
                      " does not exist (or cannot be read): the SentencePiece model the shards were made with (docs/training-on-c4.md)");
  train_data_ = std::make_shared<const ShardSet>(shard_files("data.train", run_.data.train), run_.batch.seq_len, run_.model.vocab_size);
  if (!run_.data.validation.empty())
    val_data_ = std::make_shared<const ShardSet>(shard_files("data.validation", run_.data.validation), run_.batch.seq_len,
                                                 run_.model.vocab_size);
  tokenizer_hash_ = check_data_identity(*train_data_, run_.data.tokenizer, run_.data.layout, run_.model.vocab_size, &data_note_);
  if (val_data_) {
    const uint64_t v = check_data_identity(*val_data_, run_.data.tokenizer, run_.data.layout, run_.model.vocab_size);
    if (v != 0 && tokenizer_hash_ != 0 && v != tokenizer_hash_)
      throw Error(run_.data.validation + ": the validation shards were tokenized with another tokenizer than the training shards");
  }
}

// The run directory, locked by rank 0 for the run's life (one trainer per directory), the
// checkpoint to resume from, and the resolved config.
void TrainingRun::take_run_directory() {
  if (comm_.root()) {
    make_directories(run_.output_dir);
    lock_ = std::make_unique<RunDirLock>(run_.output_dir);
    remove_stale_checkpoint_temporaries(run_.output_dir);  // left by a trainer that died while writing one
  }
  comm_.barrier();  // no rank reads the directory before rank 0 holds it
  const bool resuming = opt_.resume || !opt_.resume_from.empty();
  if (!opt_.resume_from.empty() && ::access((opt_.resume_from + "/trainer_state.json").c_str(), F_OK) != 0) {
    const std::string newest = latest_checkpoint(opt_.resume_from);
    throw Error("--resume-from " + opt_.resume_from + ": not a checkpoint directory" +
                (newest.empty() ? std::string(" (no trainer_state.json)")
                                : ", but a run directory: pass one of its checkpoints, e.g. --resume-from " + newest + ", or --resume for its latest"));
  }
  existing_ = opt_.resume_from.empty() ? latest_checkpoint(run_.output_dir) : opt_.resume_from;
  if (!existing_.empty() && !resuming)
    throw Error(run_.output_dir + " already holds checkpoints (" + existing_ + "): pass --resume, or another output_dir");
  if (comm_.root()) write_text_file_atomic(run_.output_dir + "/config.json", run_.resolved.dump(2) + "\n");
}

// The backend, the model, data parallelism (gradients in buckets through the backend's
// communicator: MPI on host memory, NCCL on a GPU; each tensor updated by its owner when the
// optimizer is sharded) and the optimizer.
void TrainingRun::build_model_and_optimizer() {
  accum_ = run_.batch.global_batch / (run_.batch.micro_batch * world_);
  last_ = opt_.max_updates > 0 ? std::min(opt_.max_updates, run_.schedule.total_steps) : run_.schedule.total_steps;
  backend_ = make_backend(choice_, static_cast<int>(run_.threads));
  model_ = std::make_unique<LlamaModel>(*backend_, run_.model, run_.precision.params, run_.batch.micro_batch, run_.batch.seq_len,
                                        run_.precision.grads);
  model_->set_graphs(run_.cuda_graphs);
  if (run_.model_init_from.empty()) {
    model_->init_random(static_cast<uint64_t>(run_.seed));
  } else {
    const auto verify = verify_reads_of(run_.model_init_from);  // a checkpoint: its files checked as they are read
    load_hf_model(model_->store(), run_.model, run_.model_init_from);
  }
  grad_comm_ = make_gradient_communicator(*backend_, comm_);
  plan_ = plan_shards(assign_optimizers(model_->tensors(), run_.optimizer), run_, world_, rank_, run_.parallel.shard_optimizer);
  optimizer_ = std::make_unique<Optimizer>(model_->store(), run_, OptimizerSharding{plan_, grad_comm_.get(), &comm_});
  optimizer_->set_graphs(run_.cuda_graphs);
  grad_sync_ = std::make_unique<GradientSync>(model_->store(), *grad_comm_, plan_, static_cast<int64_t>(run_.parallel.bucket_mb * 1048576.0),
                                              run_.parallel.overlap, run_.parallel.staging_buckets);
  pipeline_ = std::make_unique<UpdatePipeline>(*model_, *optimizer_, *grad_sync_, comm_, run_.batch.loss_normalization, accum_);
}

// The checkpoint resumed from (never a silent fall back to an older one: the user picks it, by name).
void TrainingRun::resume() {
  checkpointer_ = std::make_unique<Checkpointer>(run_, model_->store(), *optimizer_, comm_, existing_);
  state_.fingerprint = config_fingerprint(run_);
  state_.tokenizer_hash = tokenizer_hash_;
  if (!data_note_.empty()) log_->say("%s\n", data_note_.c_str());
  if (!existing_.empty()) {
    try {
      state_ = checkpointer_->restore(existing_, opt_.allow_config_change);
    } catch (const CorruptFileError& e) {
      const std::string previous = previous_checkpoint(run_.output_dir, existing_);
      throw Error(std::string(e.what()) + "\n" +
                  (previous.empty() ? "no earlier checkpoint in " + run_.output_dir + "/checkpoints"
                                    : "the previous checkpoint is " + previous + ": resume from it with --resume-from " + previous +
                                          " (multinorm checkpoint verify checks one)"));
    }
    if (state_.tokenizer_hash != 0 && tokenizer_hash_ != 0 && state_.tokenizer_hash != tokenizer_hash_)
      throw Error(existing_ + ": written from data of another tokenizer than this run's (resume with the data it was trained on)");
    if (state_.tokenizer_hash == 0) state_.tokenizer_hash = tokenizer_hash_;
    log_->say("resumed from %s (update %lld)\n", existing_.c_str(), (long long)state_.step);
  }
  restore(existing_);
  first_ = state_.step + 1;
}

// What goes on from state_ (restored from checkpoint `from`, or fresh when it is empty), for a
// resume and a divergence rollback alike: the optimizer's learning-rate scale, the metrics after its
// update dropped (this run rewrites them; starting afresh, any a run that died before its first
// checkpoint left), and the loader at its data position.
void TrainingRun::restore(const std::string& from) {
  optimizer_->set_lr_scale(state_.lr_scale);
  log_->rewind_to(state_.step);
  LoaderOptions o;
  o.micro_batch = run_.batch.micro_batch;
  o.rank = rank_;
  o.world = world_;
  o.shuffle = run_.data.shuffle;
  o.seed = static_cast<uint64_t>(run_.seed);
  o.prefetch = run_.data.prefetch;
  try {
    loader_ = std::make_unique<TrainLoader>(train_data_, o, state_.cursor);
  } catch (const Error& e) {
    if (from.empty()) throw;
    throw Error(from + "/trainer_state.json: " + e.what() + " (edited, or the data changed since the checkpoint)");
  }
}

void TrainingRun::describe() const {
  const RunConfig& r = run_;
  log_->say("multinorm train: %s, %s, %s, %lld parameters, %s + %s (optimizer state %.1f MiB, %.1f MiB for the matrices)\n", r.name.c_str(),
            choice_.reason.c_str(), comm_description(), (long long)model_->num_params(), choice_name(r.optimizer.name).c_str(), choice_name(r.optimizer.fallback).c_str(),
            optimizer_->state_bytes() / 1048576.0, optimizer_->matrix_state_bytes() / 1048576.0);
  log_->say("  %lld updates of %lld x %lld tokens (%lld micro-batches of %lld on each of %d rank(s)), loss normalisation %s, "
            "%s weights, %s gradients\n",
            (long long)r.schedule.total_steps, (long long)r.batch.global_batch, (long long)r.batch.seq_len, (long long)accum_,
            (long long)r.batch.micro_batch, world_, choice_name(r.batch.loss_normalization).c_str(), dtype_name(r.precision.params),
            dtype_name(r.precision.grads));
  // How much of the data the schedule reads: more than once is worth a line (more shards: training-on-c4.md).
  const double reads = static_cast<double>(r.schedule.total_steps) * static_cast<double>(r.batch.global_batch),
               epochs = reads / static_cast<double>(std::max<int64_t>(1, train_data_->total_sequences()));
  log_->say("  data: %lld sequences in %lld training shard(s); the schedule reads %.3g of them (%.2f epoch%s%s)\n",
            (long long)train_data_->total_sequences(), (long long)train_data_->shards(), reads, epochs, epochs == 1 ? "" : "s",
            epochs > 1 ? ": it repeats its data" : "");
  if (world_ > 1)
    log_->say("  data parallel: %d ranks, gradients over %s in %d bucket(s) of ~%.0f MiB (FP32 staging %.2f MiB), %s; optimizer %s (state on this "
              "rank %.1f of %.1f MiB); collective timeout %.0f s\n",
              world_, grad_comm_->name().c_str(), grad_sync_->buckets(), r.parallel.bucket_mb, grad_sync_->staging_bytes() / 1048576.0,
              r.parallel.overlap ? "overlapped with the last micro-batch's backward" : "after the backward pass",
              plan_.sharded() ? "sharded by tensor (ZeRO-1)" : "replicated", optimizer_->local_state_bytes() / 1048576.0,
              optimizer_->state_bytes() / 1048576.0, r.parallel.timeout_s);
  const TrainingMemory tm = training_memory(r, choice_.kind == BackendKind::Cuda);
  const auto gib = [](int64_t b) { return static_cast<double>(b) / (1ll << 30); };
  log_->say("  memory plan (%s): weights %.3f + gradients %.3f + states %.3f + activations %.3f + backend scratch %.3f = %.3f GiB\n",
            tm.cuda ? "CUDA device" : "CPU host", gib(tm.weights), gib(tm.grads), gib(tm.states), gib(tm.activations), gib(tm.backend_scratch),
            gib(tm.total()));
}

// ---- an update ----------------------------------------------------------------------------------

std::optional<QueuedUpdate> TrainingRun::queue_micro_batches(int64_t k) {
  if (k == first_) t_loop_ = t_last_end_ = Clock::now(), counted_ = backend_->queue().counters();
  if (stopped_by_) return std::nullopt;
  QueuedUpdate u;
  u.k = k;
  Comm::set_activity("update " + std::to_string(k));
  const double wait_before = loader_->wait_seconds();
  std::vector<Batch> batches;
  // Over all ranks: [counted targets of the whole global step, ranks stopped by SIGTERM, SIGINT, SIGUSR1]
  const int stops[3] = {SIGTERM, SIGINT, SIGUSR1};
  int64_t sums[4] = {0, 0, 0, 0};
  for (int i = 0; i < 3; ++i) sums[1 + i] = StopSignals::received() == stops[i];
  for (int64_t a = 0; a < accum_; ++a) {
    batches.push_back(loader_->next());
    sums[0] += batches.back().count;
  }
  comm_.allreduce_sum(sums, 4);
  for (int i = 0; i < 3; ++i)  // every rank stops here, for a signal some rank received
    if (sums[1 + i] > 0 && !stopped_by_) stopped_by_ = stops[i];
  if (stopped_by_) return std::nullopt;  // the batches go back: the checkpoint's cursor is the last update's
  u.times.data_wait_s = loader_->wait_seconds() - wait_before;
  u.cursor = batches.back().after;
  std::vector<MicroBatch> views;
  for (const Batch& b : batches) views.push_back(b.view());
  pipeline_->queue_micro_batches(views, /*total_count=*/sums[0], &u.times);
  return u;
}

void TrainingRun::queue_step(QueuedUpdate& u) {
  Comm::set_activity("update " + std::to_string(u.k));
  pipeline_->queue_step(u.k, u.k - state_.skipped, monitor_.spike_test(), &u.times);  // the skipped count covers every update before k
}

void TrainingRun::discard(QueuedUpdate&) { pipeline_->discard(); }

bool TrainingRun::settle(const QueuedUpdate& u) {
  Comm::set_activity("the statistics of update " + std::to_string(u.k));
  const StepStats st = pipeline_->wait_for_step();  // not a drain: the next update's micro-batches are queued behind it
  const Verdict v = monitor_.judge(st, state_.skipped_in_a_row);
  if (v.kind == Verdict::Diverged) return on_trip(v.why, u.k);
  if (v.kind == Verdict::Skipped) note_skip(u.k, v);
  else state_.skipped_in_a_row = 0;
  warn_swan(u.k, st);
  record(u, st);
  return evaluate_and_checkpoint(u.k, st.loss);
}

void TrainingRun::note_skip(int64_t k, const Verdict& v) {
  ++state_.skipped;
  ++state_.skipped_in_a_row;
  log_->say("update %lld: %s, skipped (%lld so far, %lld in a row)\n", (long long)k, v.why.describe().c_str(), (long long)state_.skipped,
            (long long)state_.skipped_in_a_row);
  log_->divergence(json{{"type", "divergence"}, {"step", k}, {"reason", v.why.reason}, {"value", v.why.value},
                        {"threshold", v.why.threshold}, {"action", "skip"}});
}

void TrainingRun::warn_swan(int64_t k, const StepStats& st) {
  if (st.swan.tensors == 0 || st.swan.unconverged + st.swan.fallbacks == 0) return;
  ++swan_warnings_;
  if (swan_warnings_ == 1 || swan_warnings_ % 100 == 0)
    log_->say("warning: update %lld: SWAN's Newton-Schulz did not reach optimizer.swan.ns_tolerance %.1e in %lld steps on %lld of %lld tensors "
              "(worst residual %.2e, %lld fell back to the exact path); %lld updates so far. Raise optimizer.swan.ns_steps or use whitening=eigh.\n",
              (long long)k, run_.optimizer.swan.ns_tolerance, (long long)run_.optimizer.swan.ns_steps, (long long)st.swan.unconverged,
              (long long)st.swan.tensors, st.swan.worst_residual, (long long)st.swan.fallbacks, (long long)swan_warnings_);
}

// The settled update's record: the trainer state moves to it, its metrics line and log line.
void TrainingRun::record(const QueuedUpdate& u, const StepStats& st) {
  state_.cursor = u.cursor;
  state_.step = u.k;
  UpdateRecord r;
  r.stats = &st;
  r.raw_tokens = accum_ * world_ * run_.batch.micro_batch * run_.batch.seq_len;
  state_.tokens_seen += r.raw_tokens;
  tokens_this_run_ += r.raw_tokens;
  r.tokens_seen = state_.tokens_seen;
  r.step_s = since(t_last_end_);
  result_.update_seconds += r.step_s;
  r.times = u.times;
  const QueueCounters now = backend_->queue().counters();
  r.waits.host_waits = now.host_waits - counted_.host_waits;
  r.waits.host_drains = now.host_drains - counted_.host_drains;
  r.eta_s = since(t_loop_) / static_cast<double>(u.k - first_ + 1) * static_cast<double>(last_ - u.k);
  result_.last_loss = st.loss;
  log_->update(u.k, r);
}

// Evaluation (and the stuck-loss judgement) and the checkpoint when due; then the next record's
// marks. True when a trip rolled the run back.
bool TrainingRun::evaluate_and_checkpoint(int64_t k, double loss) {
  const bool end = k == last_;
  if ((run_.eval.every > 0 && k % run_.eval.every == 0) || (end && k == run_.schedule.total_steps)) {
    if (val_data_) {
      Comm::set_activity("the evaluation after update " + std::to_string(k));
      const auto t = Clock::now();
      result_.eval = evaluate(*model_, val_data_, run_.eval.micro_batch, run_.eval.tokens, comm_);
      log_->evaluation(k, result_.eval, since(t));
    }
    // Stuck at ln V: the validation loss, or without validation data the training loss.
    const Verdict v = monitor_.judge_evaluation(val_data_ ? result_.eval.loss : loss);
    if (v.kind == Verdict::Diverged && on_trip(v.why, k)) return true;
  }
  if (checkpointer_->due(k, end)) checkpointer_->save(state_);
  ++result_.updates;
  t_last_end_ = Clock::now();
  counted_ = backend_->queue().counters();
  return false;
}

// A divergence trip. Stop: a metrics line, result.json says diverged, DivergenceError (exit status
// 3). Rollback: the last good checkpoint's weights, optimizer state and data position, the learning
// rate lowered; returns true, and the loop goes on from the checkpoint's next update.
bool TrainingRun::on_trip(const DivergenceTrip& trip, int64_t k) {
  const std::string good = checkpointer_->last_good();
  const bool rolls_back = run_.divergence.action == DivergenceAction::Rollback;
  const bool roll = rolls_back && state_.rollbacks < run_.divergence.max_rollbacks && !good.empty();
  json d = {{"type", "divergence"}, {"step", k}, {"reason", trip.reason}, {"value", trip.value}, {"threshold", trip.threshold},
            {"action", roll ? "rollback" : "stop"}};
  if (!roll) {
    log_->say("update %lld: diverged: %s; stopping (divergence.action %s%s)\n", (long long)k, trip.describe().c_str(),
              choice_name(run_.divergence.action).c_str(), rolls_back ? ", rollbacks used up or no checkpoint" : "");
    log_->divergence(d);
    json res = result_common(true);
    res["divergence"] = d, res["last_good_checkpoint"] = good;
    log_->result(res);
    throw DivergenceError("update " + std::to_string(k) + " diverged: " + trip.describe() + "; the last good checkpoint is " +
                          (good.empty() ? std::string("none") : good) + " (metrics.jsonl and result.json record it)");
  }
  const double scale = state_.lr_scale * run_.divergence.rollback_lr_factor;
  log_->say("update %lld: diverged: %s; rolling back to %s with the learning rate x %.4g (rollback %lld of %lld)\n", (long long)k,
            trip.describe().c_str(), good.c_str(), scale, (long long)state_.rollbacks + 1, (long long)run_.divergence.max_rollbacks);
  const int64_t rollbacks = state_.rollbacks + 1;
  state_ = checkpointer_->restore(good, /*allow_config_change=*/true);
  state_.rollbacks = rollbacks;
  state_.lr_scale = scale;
  restore(good);  // the diverged updates' metrics lines go; the trip's stays
  monitor_.reset();
  d["rolled_back_to"] = state_.step;
  log_->divergence(d);
  return true;
}

TrainResult TrainingRun::finish() {
  log_->end();
  if (stopped_by_) {  // the last update's checkpoint, unless it has one
    if (state_.step > 0 && checkpointer_->last_good().find(checkpoint_name(state_.step)) == std::string::npos) checkpointer_->save(state_);
    result_.stopped_by = stopped_by_;
    log_->say("stopped by %s after update %lld: checkpoint %s; go on with --resume (exit status %d)\n", StopSignals::name(stopped_by_),
              (long long)state_.step, checkpointer_->last_good().c_str(), kStoppedBySignalStatus);
  }
  const GraphCache& mg = model_->graphs();
  const GraphCache& og = optimizer_->graphs();
  if (mg.captures() > 0)
    log_->say("  CUDA graphs: %lld capture(s), %lld micro-batches replayed%s%s\n", (long long)mg.captures(), (long long)mg.replays(),
              mg.gave_up().empty() ? "" : "; turned off: ", mg.gave_up().c_str());
  if (og.captures() > 0)
    log_->say("  CUDA graphs: the optimizer's update %lld capture(s), %lld updates replayed\n", (long long)og.captures(), (long long)og.replays());
  result_.run_dir = run_.output_dir;
  result_.last_checkpoint = checkpointer_->last_good();
  result_.skipped = state_.skipped;
  result_.seconds = since(t_start_);
  result_.tokens_per_s = tokens_this_run_ / std::max(result_.update_seconds, 1e-9);  // training, not evaluation or checkpoints
  if (state_.step == run_.schedule.total_steps) {  // complete: sweeps skip it from now on
    json res = result_common(false);
    res.update({{"tokens", state_.tokens_seen}, {"skipped_updates", state_.skipped}, {"tokens_per_s", result_.tokens_per_s},
                {"update_s", result_.update_seconds}, {"wall_s", result_.seconds}, {"final_train_loss", result_.last_loss},
                {"optimizer_state_bytes", optimizer_->state_bytes()}, {"matrix_state_bytes", optimizer_->matrix_state_bytes()},
                {"backend", backend_->name()}, {"backend_choice", choice_.reason}, {"ranks", world_},
                {"gradient_communicator", grad_comm_->name()}});
    if (result_.eval.batches) res["final_val_loss"] = result_.eval.loss, res["final_val_ppl"] = result_.eval.perplexity();
    // What this process replayed from CUDA graphs (GraphCache; zeros where the backend has none).
    res["cuda_graphs"] = {{"micro_batch_captures", mg.captures()}, {"micro_batches_replayed", mg.replays()},
                          {"update_captures", og.captures()}, {"updates_replayed", og.replays()},
                          {"gave_up", mg.gave_up().empty() ? og.gave_up() : mg.gave_up()}};
    log_->result(res);
  }
  return result_;
}

// The fields every result.json has, complete or diverged.
json TrainingRun::result_common(bool diverged) const {
  return {{"diverged", diverged}, {"updates", state_.step}, {"rollbacks", state_.rollbacks}, {"optimizer", choice_name(run_.optimizer.name)}};
}

}  // namespace multinorm
