#include "model/training/pretrain.h"

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "core/log.h"
#include "data/t5_dataset.h"
#include "data/text_tokenizer.h"
#include "data/tokenizer.h"
#include "model/checkpoint/checkpoint_config.h"
#include "model/training/arguments.h"
#include "model/training/bert_data.h"
#include "model/training/gpt_data.h"
#include "model/training/parallel_runtime.h"
#include "model/training/trainer.h"
#include "parallel/communicator.h"
#include "parallel/failure_record.h"
#include "parallel/fault_injection.h"
#include "parallel/phase_watch.h"
#include "parallel/job_exit.h"

namespace mpitron {

int pretrain_main(int argc, char** argv, PretrainModel which) {
  int provided = 0;
  // --async-save writes checkpoints with MPI-IO from a background thread.
  // The simulated device's NCCL stand-in makes MPI calls from its streams' threads too.
#if defined(MPITRON_CUDA_SIM)
  const bool async_save = true;
#else
  const bool async_save = std::any_of(argv + 1, argv + argc, [](const char* a) { return std::string(a) == "--async-save"; });
#endif
  MPI_Init_thread(&argc, &argv, async_save ? MPI_THREAD_MULTIPLE : MPI_THREAD_FUNNELED, &provided);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  set_process_rank(world > 1 ? rank : -1);
  install_job_exit();  // a collective that times out ends every rank (parallel/job_exit.h)
  int rc = 0;
  try {
    enter_phase("setup", 0);  // failure records name the phase (parallel/failure_record.h)
    check_fault_plan();       // MPITRON_FAULT (tests) refused now when malformed
    TrainArgs args;
    args.model.bert = which == PretrainModel::BERT;  // pretrain_bert's flags and model
    args.model.t5 = which == PretrainModel::T5;      // pretrain_t5's
    args.world_size = world;  // parsing sets dp = world / (tp x pp)
    if (parse_train_args(argc, argv, args)) {
      if (!args.save.empty()) set_failure_record_dir(args.save + "/failures");
      configure_phase_timeouts(parse_ft_timeouts(args.ft_timeouts));
      enter_phase("setup", 0);  // its deadline starts now (--ft-timeouts)
      ParallelRuntime runtime(MPI_COMM_WORLD, args);
      const ParallelContext par = runtime.context();
      if (world > 1)
        log_info(runtime.describe(), args.sequence_parallel ? ", sequence parallel" : "",
                 args.zero_stage ? str(", ZeRO stage ", args.zero_stage) : "");
      data::TokenizerSpec spec{args.tokenizer_type, args.tokenizer_model, args.vocab_file, args.merge_file};
      // T5: the WordPiece vocabulary with [BOS], [EOS] and the --vocab-extra-ids sentinels appended (Megatron's).
      if (args.model.t5) spec.vocab_extra_ids = args.vocab_extra_ids;
      const auto tok_ptr = data::make_tokenizer(spec);
      const data::TextTokenizer& tok = *tok_ptr;
      // Recorded in every checkpoint and compared on --load (model/checkpoint/checkpointing.h).
      args.tokenizer_identity = data::tokenizer_identity(spec, tok).dump();
      if (args.model.t5) (void)data::T5Vocab::from(tok, args.vocab_extra_ids);  // checks [MASK], [PAD], the sentinels
      const int64_t vocab = tok.vocab_size();
      args.model.vocab_size = vocab;
      args.model.padded_vocab_size = data::padded_vocab_size(vocab, static_cast<int>(args.tensor_model_parallel_size),
                                                             static_cast<int>(args.make_vocab_size_divisible_by));
      // A checkpoint saved at another TP size may have another padded vocabulary;
      // adopt it when it still divides by this TP size (rows past the vocabulary are never used).
      if (!args.load.empty() && checkpoint_exists(args.load)) {
        const int64_t saved = read_checkpoint_config(args.load).padded_vocab_size;
        if (saved != args.model.padded_vocab_size && saved >= vocab &&
            saved % args.tensor_model_parallel_size == 0) {
          log_info("--load ", args.load, ": the checkpoint's padded vocabulary ", saved, " divides by TP ",
                   args.tensor_model_parallel_size, ": using it instead of ", args.model.padded_vocab_size);
          args.model.padded_vocab_size = saved;
        }
      }
      // Rank 0 builds the index caches first; the others then load them.
      auto make_data = [&] {
        return args.model.bert ? make_bert_data(args, tok)
               : args.model.t5 ? make_t5_data(args, tok)
                               : make_gpt_data(args, tok.vocab_size());
      };
      std::shared_ptr<SampleSource> data;
      const auto barrier = [] {
        JobDeadline d("the wait for rank 0 to build the dataset indices", "rank 0 or another rank is stuck",
                      comm_timeout_from_env());
        MPI_Barrier(MPI_COMM_WORLD);
      };
      if (rank == 0) {
        try {
          data = make_data();
        } catch (...) {
          barrier();
          throw;
        }
      }
      barrier();
      if (rank != 0) data = make_data();
      Trainer trainer(args, data, par);
      const TrainSummary s = trainer.run();
      enter_phase("end", s.iterations);  // no deadline after the last phase
      if (s.steps_run == 0)
        log_info("done: nothing trained: the run was already at iteration ", s.iterations, ", its end");
      else
        log_info("done: ", s.iterations, " iterations; train loss ", s.first_loss, " -> ", s.last_loss,
                 s.lm_losses.empty() ? ""
                                     : str(" (lm loss ", s.lm_losses.front(), " -> ", s.lm_losses.back(),
                                           args.model.binary_head
                                               ? str(", sop loss ", s.sop_losses.front(), " -> ", s.sop_losses.back())
                                               : "",
                                           " over single steps)"),
                 s.valid_loss > 0 ? str("; validation loss ", s.valid_loss, " (perplexity ", s.valid_ppl, ")") : "",
                 s.spike_skips ? str("; ", s.spike_skips, " spike steps skipped (", s.spike_reruns, " reruns)") : "");
      if (!s.checkpoint_dir.empty()) log_info("checkpoint: ", s.checkpoint_dir);
      if (!args.tensorboard_dir.empty()) log_info("tensorboard events and metrics.jsonl: ", args.tensorboard_dir);
    }
  } catch (const HostFault& e) {  // a re-run did not reproduce a step: a fault of e.faulty_rank()'s hardware
    std::fprintf(stderr, "%s\n", e.what());
    rc = kExitHostFault;
    write_failure_record({"host_fault", e.faulty_rank(), e.message(), rc});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    rc = 1;
    write_failure_record({"error", rank, e.what(), rc});
  }
  return finish_job(rc);
}

}  // namespace mpitron
