// A training run's set-up and its updates' three steps (training_run.h); each update's device work
// is the UpdatePipeline's (update_pipeline.h). Data parallelism: every rank runs the same code on
// its slice of each global step; rank 0 alone writes the run directory (config, metrics,
// checkpoints) and logs.
#include "training_run.h"

#include <signal.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "multinorm/error.h"
#include "multinorm/memory_estimate.h"

namespace multinorm {

namespace {

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

TrainingRun::TrainingRun(const RunConfig& run, const TrainOptions& opt)
    : run_(run), opt_(opt), comm_(Comm::world()), world_(comm_.size()), rank_(comm_.rank()),
      last_(opt.max_updates > 0 ? std::min(opt.max_updates, run.schedule.total_steps) : run.schedule.total_steps), t_start_(Clock::now()),
      parts_(assemble_run(run, opt, comm_, last_)), monitor_(run.divergence, std::log(static_cast<double>(run.model.vocab_size))) {
  state_.fingerprint = config_fingerprint(run_);
  state_.tokenizer_hash = parts_.data.tokenizer_hash;
  if (!parts_.data.note.empty()) log().say("%s\n", parts_.data.note.c_str());
  // Never a silent fall back to an older checkpoint than the one named: the user picks it, by name.
  restore(parts_.resume_from, opt_.allow_config_change);
  if (!parts_.resume_from.empty()) log().say("resumed from %s (update %lld)\n", parts_.resume_from.c_str(), (long long)state_.step);
  first_ = state_.step + 1;
  describe();
}

TrainingRun::~TrainingRun() = default;

// The run's state from checkpoint `dir` ("": a fresh start), for a resume and a divergence rollback
// alike: the weights, optimizer state and trainer state read (the data's tokenizer checked against
// the checkpoint's), `adjust` applied to the trainer state (a rollback's count and learning rate),
// then what goes on from it: the optimizer's learning-rate scale, the metrics after its update
// dropped (this run rewrites them; starting afresh, any a run that died before its first checkpoint
// left), and the loader at its data position.
void TrainingRun::restore(const std::string& dir, bool allow_config_change, const std::function<void(TrainerState&)>& adjust) {
  if (!dir.empty()) {
    try {
      state_ = parts_.checkpointer->restore(dir, allow_config_change);
    } catch (const CorruptFileError& e) {
      const std::string previous = previous_checkpoint(run_.output_dir, dir);
      throw Error(std::string(e.what()) + "\n" +
                  (previous.empty() ? "no earlier checkpoint in " + run_.output_dir + "/checkpoints"
                                    : "the previous checkpoint is " + previous + ": resume from it with --resume-from " + previous +
                                          " (multinorm checkpoint verify checks one)"));
    }
    const uint64_t ours = parts_.data.tokenizer_hash;
    if (state_.tokenizer_hash != 0 && ours != 0 && state_.tokenizer_hash != ours)
      throw Error(dir + ": written from data of another tokenizer than this run's (resume with the data it was trained on)");
    if (state_.tokenizer_hash == 0) state_.tokenizer_hash = ours;
  }
  if (adjust) adjust(state_);
  parts_.optimizer->set_lr_scale(state_.lr_scale);
  log().rewind_to(state_.step);
  LoaderOptions o;
  o.micro_batch = run_.batch.micro_batch;
  o.rank = rank_;
  o.world = world_;
  o.shuffle = run_.data.shuffle;
  o.seed = static_cast<uint64_t>(run_.seed);
  o.prefetch = run_.data.prefetch;
  try {
    loader_ = std::make_unique<TrainLoader>(parts_.data.train, o, state_.cursor);
  } catch (const Error& e) {
    if (dir.empty()) throw;
    throw Error(dir + "/trainer_state.json: " + e.what() + " (edited, or the data changed since the checkpoint)");
  }
}

void TrainingRun::describe() const {
  const RunConfig& r = run_;
  log().say("multinorm train: %s, %s, %s, %lld parameters, %s + %s (optimizer state %.1f MiB, %.1f MiB for the matrices)\n", r.name.c_str(),
            parts_.choice.reason.c_str(), comm_description(), (long long)parts_.model->num_params(), choice_name(r.optimizer.name).c_str(), choice_name(r.optimizer.fallback).c_str(),
            parts_.optimizer->state_bytes() / 1048576.0, parts_.optimizer->matrix_state_bytes() / 1048576.0);
  log().say("  %lld updates of %lld x %lld tokens (%lld micro-batches of %lld on each of %d rank(s)), loss normalisation %s, "
            "%s weights, %s gradients\n",
            (long long)r.schedule.total_steps, (long long)r.batch.global_batch, (long long)r.batch.seq_len, (long long)parts_.accum,
            (long long)r.batch.micro_batch, world_, choice_name(r.batch.loss_normalization).c_str(), dtype_name(r.precision.params),
            dtype_name(r.precision.grads));
  // How much of the data the schedule reads: more than once is worth a line (more shards: training-on-c4.md).
  const double reads = static_cast<double>(r.schedule.total_steps) * static_cast<double>(r.batch.global_batch),
               epochs = reads / static_cast<double>(std::max<int64_t>(1, parts_.data.train->total_sequences()));
  log().say("  data: %lld sequences in %lld training shard(s); the schedule reads %.3g of them (%.2f epoch%s%s)\n",
            (long long)parts_.data.train->total_sequences(), (long long)parts_.data.train->shards(), reads, epochs, epochs == 1 ? "" : "s",
            epochs > 1 ? ": it repeats its data" : "");
  if (world_ > 1)
    log().say("  data parallel: %d ranks, gradients over %s in %d bucket(s) of ~%.0f MiB (FP32 staging %.2f MiB), %s; optimizer %s (state on this "
              "rank %.1f of %.1f MiB); collective timeout %.0f s\n",
              world_, parts_.grad_comm->name().c_str(), parts_.grad_sync->buckets(), r.parallel.bucket_mb, parts_.grad_sync->staging_bytes() / 1048576.0,
              r.parallel.overlap ? "overlapped with the last micro-batch's backward" : "after the backward pass",
              parts_.plan.sharded() ? "sharded by tensor (ZeRO-1)" : "replicated", parts_.optimizer->local_state_bytes() / 1048576.0,
              parts_.optimizer->state_bytes() / 1048576.0, r.parallel.timeout_s);
  const TrainingMemory tm = training_memory(r, parts_.choice.kind == BackendKind::Cuda);
  const auto gib = [](int64_t b) { return static_cast<double>(b) / (1ll << 30); };
  log().say("  memory plan (%s): weights %.3f + gradients %.3f + states %.3f + activations %.3f + backend scratch %.3f = %.3f GiB\n",
            tm.cuda ? "CUDA device" : "CPU host", gib(tm.weights), gib(tm.grads), gib(tm.states), gib(tm.activations), gib(tm.backend_scratch),
            gib(tm.total()));
}

// ---- an update ----------------------------------------------------------------------------------

std::optional<QueuedUpdate> TrainingRun::queue_micro_batches(int64_t k) {
  const Clock::time_point t0 = Clock::now();
  if (k == first_) t_loop_ = t_last_end_ = t0, counted_ = parts_.backend->queue().counters();
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
  for (int64_t a = 0; a < parts_.accum; ++a) {
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
  parts_.pipeline->queue_micro_batches(views, /*total_count=*/sums[0], &u.times);
  queued_k_ = k, queued_s_ = since(t0);
  return u;
}

void TrainingRun::queue_step(QueuedUpdate& u) {
  Comm::set_activity("update " + std::to_string(u.k));
  parts_.pipeline->queue_step(u.k, u.k - state_.skipped, monitor_.spike_test(), &u.times);  // the skipped count covers every update before k
}

void TrainingRun::discard(QueuedUpdate&) {
  parts_.pipeline->discard();
  queued_k_ = -1, owed_s_ = 0.0;  // a rollback: the run goes on from its checkpoint
}

bool TrainingRun::settle(const QueuedUpdate& u) {
  Comm::set_activity("the statistics of update " + std::to_string(u.k));
  const StepStats st = parts_.pipeline->wait_for_step();  // not a drain: the next update's micro-batches are queued behind it
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
  log().say("update %lld: %s, skipped (%lld so far, %lld in a row)\n", (long long)k, v.why.describe().c_str(), (long long)state_.skipped,
            (long long)state_.skipped_in_a_row);
  log().divergence(json{{"type", "divergence"}, {"step", k}, {"reason", v.why.reason}, {"value", v.why.value},
                        {"threshold", v.why.threshold}, {"action", "skip"}});
}

void TrainingRun::warn_swan(int64_t k, const StepStats& st) {
  if (st.swan.tensors == 0 || st.swan.unconverged + st.swan.fallbacks == 0) return;
  ++swan_warnings_;
  if (swan_warnings_ == 1 || swan_warnings_ % 100 == 0)
    log().say("warning: update %lld: SWAN's Newton-Schulz did not reach optimizer.swan.ns_tolerance %.1e in %lld steps on %lld of %lld tensors "
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
  r.raw_tokens = parts_.accum * world_ * run_.batch.micro_batch * run_.batch.seq_len;
  state_.tokens_seen += r.raw_tokens;
  tokens_this_run_ += r.raw_tokens;
  r.tokens_seen = state_.tokens_seen;
  const double next_queue_s = queued_k_ == u.k + 1 ? queued_s_ : 0.0;  // update k + 1's, queued in this interval
  r.step_s = since(t_last_end_) - next_queue_s + owed_s_;
  owed_s_ = next_queue_s;
  result_.update_seconds += r.step_s;
  r.times = u.times;
  const QueueCounters now = parts_.backend->queue().counters();
  r.waits.host_waits = now.host_waits - counted_.host_waits;
  r.waits.host_drains = now.host_drains - counted_.host_drains;
  r.eta_s = since(t_loop_) / static_cast<double>(u.k - first_ + 1) * static_cast<double>(last_ - u.k);
  result_.last_loss = st.loss;
  log().update(u.k, r);
}

// Evaluation (and the stuck-loss judgement) and the checkpoint when due; then the next record's
// marks. True when a trip rolled the run back.
bool TrainingRun::evaluate_and_checkpoint(int64_t k, double loss) {
  const bool end = k == last_;
  if ((run_.eval.every > 0 && k % run_.eval.every == 0) || (end && k == run_.schedule.total_steps)) {
    if (parts_.data.validation) {
      Comm::set_activity("the evaluation after update " + std::to_string(k));
      const auto t = Clock::now();
      result_.eval = evaluate(*parts_.model, parts_.data.validation, run_.eval.micro_batch, run_.eval.tokens, comm_);
      log().evaluation(k, result_.eval, since(t));
    }
    // Stuck at ln V: the validation loss, or without validation data the training loss.
    const Verdict v = monitor_.judge_evaluation(parts_.data.validation ? result_.eval.loss : loss);
    if (v.kind == Verdict::Diverged && on_trip(v.why, k)) return true;
  }
  if (parts_.checkpointer->due(k, end)) parts_.checkpointer->save(state_);
  ++result_.updates;
  t_last_end_ = Clock::now();
  counted_ = parts_.backend->queue().counters();
  return false;
}

// A divergence trip. Stop: a metrics line, result.json says diverged, DivergenceError (exit status
// 3). Rollback: the last good checkpoint's weights, optimizer state and data position, the learning
// rate lowered; returns true, and the loop goes on from the checkpoint's next update.
bool TrainingRun::on_trip(const DivergenceTrip& trip, int64_t k) {
  const std::string good = parts_.checkpointer->last_good();
  const bool rolls_back = run_.divergence.action == DivergenceAction::Rollback;
  const bool roll = rolls_back && state_.rollbacks < run_.divergence.max_rollbacks && !good.empty();
  json d = {{"type", "divergence"}, {"step", k}, {"reason", trip.reason}, {"value", trip.value}, {"threshold", trip.threshold},
            {"action", roll ? "rollback" : "stop"}};
  if (!roll) {
    log().say("update %lld: diverged: %s; stopping (divergence.action %s%s)\n", (long long)k, trip.describe().c_str(),
              choice_name(run_.divergence.action).c_str(), rolls_back ? ", rollbacks used up or no checkpoint" : "");
    log().divergence(d);
    sum_up();
    write_result(d);
    throw DivergenceError("update " + std::to_string(k) + " diverged: " + trip.describe() + "; the last good checkpoint is " +
                          (good.empty() ? std::string("none") : good) + " (metrics.jsonl and result.json record it)");
  }
  const double scale = state_.lr_scale * run_.divergence.rollback_lr_factor;
  log().say("update %lld: diverged: %s; rolling back to %s with the learning rate x %.4g (rollback %lld of %lld)\n", (long long)k,
            trip.describe().c_str(), good.c_str(), scale, (long long)state_.rollbacks + 1, (long long)run_.divergence.max_rollbacks);
  const int64_t rollbacks = state_.rollbacks + 1;
  restore(good, /*allow_config_change=*/true, [&](TrainerState& s) {  // the diverged updates' metrics lines go; the trip's stays
    s.rollbacks = rollbacks;
    s.lr_scale = scale;
  });
  monitor_.reset();
  d["rolled_back_to"] = state_.step;
  log().divergence(d);
  return true;
}

// The closing line's word on device loops (SWAN's Newton-Schulz ended by a WHILE node in the update's
// graph): how many the graphs hold, or that the runtime refused them and every step ran.
static std::string device_loops_said(const QueueCounters& q) {
  if (q.device_loops_refused > 0) return "; device loops refused by the runtime (every Newton-Schulz step ran)";
  if (q.device_loops > 0) return ", holding " + std::to_string(q.device_loops) + " device loop(s)";
  return "";
}

TrainResult TrainingRun::finish() {
  log().end();
  if (stopped_by_) {  // the last update's checkpoint, unless it has one
    if (state_.step > 0 && parts_.checkpointer->last_good().find(checkpoint_name(state_.step)) == std::string::npos) parts_.checkpointer->save(state_);
    result_.stopped_by = stopped_by_;
    log().say("stopped by %s after update %lld: checkpoint %s; go on with --resume (exit status %d)\n", StopSignals::name(stopped_by_),
              (long long)state_.step, parts_.checkpointer->last_good().c_str(), kStoppedBySignalStatus);
  }
  const GraphCache& mg = parts_.model->graphs();
  const GraphCache& og = parts_.optimizer->graphs();
  if (mg.captures() > 0)
    log().say("  CUDA graphs: %lld capture(s), %lld micro-batches replayed%s%s\n", (long long)mg.captures(), (long long)mg.replays(),
              mg.gave_up().empty() ? "" : "; turned off: ", mg.gave_up().c_str());
  const QueueCounters q = parts_.backend->queue().counters();
  if (og.captures() > 0)
    log().say("  CUDA graphs: the optimizer's update %lld capture(s), %lld updates replayed%s\n", (long long)og.captures(), (long long)og.replays(),
              device_loops_said(q).c_str());
  sum_up();
  if (state_.step == run_.schedule.total_steps) write_result(json());  // complete: sweeps skip it from now on
  return result_;
}

// The run's figures so far into result_ (what train() returns and result.json holds).
void TrainingRun::sum_up() {
  result_.run_dir = run_.output_dir;
  result_.last_checkpoint = parts_.checkpointer->last_good();
  result_.skipped = state_.skipped;
  result_.seconds = since(t_start_);
  result_.tokens_per_s = tokens_this_run_ / std::max(result_.update_seconds, 1e-9);  // training, not evaluation or checkpoints
}

// result.json, through the run log, for a run that completed (divergence null) or diverged (the
// trip's record): the run's figures (sum_up()) and the CUDA graphs it replayed.
void TrainingRun::write_result(const json& divergence) {
  const GraphCache& mg = parts_.model->graphs();
  const GraphCache& og = parts_.optimizer->graphs();
  json res = {{"diverged", !divergence.is_null()}, {"updates", state_.step}, {"rollbacks", state_.rollbacks},
              {"optimizer", choice_name(run_.optimizer.name)}, {"tokens", state_.tokens_seen}, {"skipped_updates", state_.skipped},
              {"tokens_per_s", result_.tokens_per_s}, {"update_s", result_.update_seconds}, {"wall_s", result_.seconds},
              {"final_train_loss", result_.last_loss}, {"optimizer_state_bytes", parts_.optimizer->state_bytes()},
              {"matrix_state_bytes", parts_.optimizer->matrix_state_bytes()}, {"backend", parts_.backend->name()},
              {"backend_choice", parts_.choice.reason}, {"ranks", world_}, {"gradient_communicator", parts_.grad_comm->name()}};
  if (result_.eval.batches) res["final_val_loss"] = result_.eval.loss, res["final_val_ppl"] = result_.eval.perplexity();
  // What this process replayed from CUDA graphs (GraphCache; zeros where the backend has none).
  const QueueCounters q = parts_.backend->queue().counters();
  res["cuda_graphs"] = {{"micro_batch_captures", mg.captures()}, {"micro_batches_replayed", mg.replays()},
                        {"update_captures", og.captures()}, {"updates_replayed", og.replays()},
                        {"gave_up", mg.gave_up().empty() ? og.gave_up() : mg.gave_up()},
                        {"device_loops", q.device_loops}, {"device_loops_refused", q.device_loops_refused}};
  if (!divergence.is_null()) res["divergence"] = divergence, res["last_good_checkpoint"] = result_.last_checkpoint;
  log().result(res);
}

}  // namespace multinorm
