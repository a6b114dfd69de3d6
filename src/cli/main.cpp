// memtrain: a distributed, memory-managed trainer. `memtrain --help`.

#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <string>

#include "commands.h"
#include "memtrain/util/error.h"

int main(int argc, char** argv) {
  CLI::App app{
      "memtrain: distributed, memory-managed training over MPI.\n"
      "Start one rank per device: mpirun -np N memtrain train ...",
      "memtrain"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "memtrain 0.1.0");
  // A usage error reads like every other refusal: one `memtrain: error:`
  // line (then where the help is), exit status 2.
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return std::string("memtrain: error: ") + e.what() +
           "\nRun with --help for more information.\n";
  });

  memtrain::cli::TrainArgs train_args;
  memtrain::cli::add_train(app, train_args);
  memtrain::cli::EvalArgs eval_args;
  memtrain::cli::add_eval(app, eval_args);
  memtrain::cli::EmbedArgs embed_args;
  memtrain::cli::add_embed(app, embed_args);
  memtrain::cli::PredictArgs predict_args;
  memtrain::cli::add_predict(app, predict_args);
  memtrain::cli::add_export(app);
  memtrain::cli::add_make_data(app);
  memtrain::cli::add_inspect(app);
  memtrain::cli::add_convert_nifti(app);
  memtrain::cli::add_convert_images(app);
  memtrain::cli::add_convert_captions(app);
  memtrain::cli::add_convert_dataset(app);
  memtrain::cli::add_plot(app);
  memtrain::cli::add_probe(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? memtrain::kExitOk : memtrain::kExitUsage;
  }
  try {
    if (app.got_subcommand("train")) {
      return memtrain::cli::run_train(train_args, &argc, &argv);
    }
    if (app.got_subcommand("eval"))
      return memtrain::cli::run_eval(eval_args, &argc, &argv);
    if (app.got_subcommand("embed"))
      return memtrain::cli::run_embed(embed_args);
    if (app.got_subcommand("predict"))
      return memtrain::cli::run_predict(predict_args, &argc, &argv);
    if (app.got_subcommand("export"))
      return memtrain::cli::run_export();
    if (app.got_subcommand("make-data"))
      return memtrain::cli::run_make_data();
    if (app.got_subcommand("inspect"))
      return memtrain::cli::run_inspect();
    if (app.got_subcommand("convert-nifti"))
      return memtrain::cli::run_convert_nifti();
    if (app.got_subcommand("convert-images"))
      return memtrain::cli::run_convert_images();
    if (app.got_subcommand("convert-captions"))
      return memtrain::cli::run_convert_captions();
    if (app.got_subcommand("convert-dataset"))
      return memtrain::cli::run_convert_dataset();
    if (app.got_subcommand("plot"))
      return memtrain::cli::run_plot();
    if (app.got_subcommand("probe"))
      return memtrain::cli::run_probe();
  } catch (const memtrain::Error& e) {
    std::fprintf(stderr, "memtrain: error: %s\n", e.what());
    return memtrain::kExitUsage;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "memtrain: error: %s\n", e.what());
    return memtrain::kExitFailure;
  }
  return memtrain::kExitUsage;
}
