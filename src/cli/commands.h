#pragma once
// The memtrain sub-commands. Each returns the process exit status.

#include <string>
#include <vector>

#include "memtrain/infer/embed.h"

namespace CLI {
class App;
}

namespace memtrain::cli {

struct TrainArgs {
  std::string config;
  std::vector<std::string> overrides;  // "section.key=value"
  bool print_config = false;
  bool keys_markdown = false;
  std::string resume;  // "", a checkpoint file or folder, or "auto"
};

void add_train(CLI::App& app, TrainArgs& args);
int run_train(const TrainArgs& args, int* argc, char*** argv);

struct EvalArgs {
  std::string config;
  std::vector<std::string> overrides;  // "section.key=value"
  std::string weights;
};

void add_eval(CLI::App& app, EvalArgs& args);
int run_eval(const EvalArgs& args, int* argc, char*** argv);

struct PredictArgs {
  std::string config;
  std::vector<std::string> overrides;  // "section.key=value"
  std::string weights, input, out, labels, label_map;
  std::string analyze_orientation;  // "" or an axis code, e.g. LAS
};

void add_predict(CLI::App& app, PredictArgs& args);
int run_predict(const PredictArgs& args, int* argc, char*** argv);

struct EmbedArgs {
  std::string config;
  std::vector<std::string> overrides;  // "section.key=value"
  std::string weights;
  EmbedSpec spec;
};

void add_embed(CLI::App& app, EmbedArgs& args);
int run_embed(EmbedArgs& args);

void add_export(CLI::App& app);
int run_export();

void add_make_data(CLI::App& app);
int run_make_data();

void add_inspect(CLI::App& app);
int run_inspect();

void add_convert_nifti(CLI::App& app);
int run_convert_nifti();

void add_convert_images(CLI::App& app);
int run_convert_images();

void add_convert_captions(CLI::App& app);
int run_convert_captions();

void add_convert_dataset(CLI::App& app);
int run_convert_dataset();

void add_plot(CLI::App& app);
int run_plot();

void add_probe(CLI::App& app);
int run_probe();

}  // namespace memtrain::cli
