// serve_and_reload: a serving loop that embeds tpreload. It loads a model,
// answers generation requests with the tensor-parallel forward pass, and on a
// reload request pauses between requests, reloads the weights in place, drops
// what it derived from the old weights (its answer cache) and resumes.
//
//   launch/mpirun.sh 2 build/examples/serve_and_reload --model DIR [--requests FILE]
//
// Requests, one per line, from FILE or standard input (read on rank 0, handed to
// every rank over the control plane):
//   generate N T1 T2 ...   greedy-decode N tokens after the prompt T1 T2 ...
//   reload [PATH]          reload in place from PATH (else the model's own location)
//   quit                   stop (as the end of the input does)
// Blank lines and lines starting with '#' are skipped. A reload that fails on
// every rank alike is reported and serving goes on: one refused before any write
// (a bad path, a checkpoint that does not fit) leaves the old weights; the error
// of one that failed part-way says so. Any other failure ends the job.
#include <CLI/CLI.hpp>

#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

#include "tpreload/comm/agreement.h"
#include "tpreload/core/error.h"
#include "tpreload/core/log.h"
#include "tpreload/model/model.h"
#include "tpreload/reference/forward.h"
#include "tpreload/reload/reload.h"
#include "tpreload/reload/report.h"
#include "tpreload/runtime/data_plane.h"
#include "tpreload/runtime/program.h"

using namespace tpreload;

namespace {

using Tokens = std::vector<std::int64_t>;

// COLLECTIVE. The next request line on every rank (rank 0 reads it); nullopt at
// the end of the input.
std::optional<std::string> next_request(Communicator& world, std::istream* in) {
  std::string line;
  std::int64_t state[2] = {0, 0};  // has a line, its length
  if (world.rank() == 0) {
    bool got = false;
    while (!got && std::getline(*in, line))
      got = !line.empty() && line.find_first_not_of(" \t") != std::string::npos && line[0] != '#';
    state[0] = got ? 1 : 0;
    state[1] = static_cast<std::int64_t>(line.size());
  }
  world.broadcast(MutableBytes(state, sizeof state), 0);
  if (!state[0]) return std::nullopt;
  line.resize(static_cast<std::size_t>(state[1]));
  world.broadcast(MutableBytes(line.data(), line.size()), 0);
  return line;
}

std::string text(const Tokens& tokens) {
  std::string out = "[";
  for (std::size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + std::to_string(tokens[i]);
  return out + "]";
}

// Greedy decoding: the most likely next token, `count` times.
Tokens generate(const TensorParallelModel& model, Communicator& world, Tokens prompt, int count) {
  Tokens out;
  for (int i = 0; i < count; ++i) {
    const std::int64_t next =
        reference_forward(model, prompt, world)[-1].argmax().item<std::int64_t>();
    prompt.push_back(next);
    out.push_back(next);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"A serving loop that reloads its model's weights in place between requests."};
  std::string model_dir, requests, device = "cpu", transport = "mpi";
  double bucket_mb = tpreload::ReloadOptions{}.bucket_bytes / 1048576.0;
  app.add_option("--model", model_dir, "Model directory (config.json and its weights)")->required();
  app.add_option("--requests", requests, "Request file (default: standard input)");
  app.add_option("--device", device, "Where the parameters live: cpu or cuda")
      ->capture_default_str();
  app.add_option("--transport", transport, "mpi or nccl")->capture_default_str();
  app.add_option("--bucket-mb", bucket_mb, "Reload bucket size in MiB")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  return run_mpi_program(&argc, &argv, "warn", CommOptions{}, [&](MpiCommunicator& world) {
    std::ifstream file;
    std::istream* in = &std::cin;
    if (world.rank() == 0 && !requests.empty()) {
      file.open(requests);
      if (!file) raise<UsageError>("cannot open request file '", requests, "'");
      in = &file;
    }
    DataPlaneOptions where;
    where.device = device;
    where.transport = transport;
    DataPlane plane = open_data_plane(world, where);
    ModelOptions options;
    options.tp_size = world.size();
    options.tp_rank = world.rank();
    options.device = plane.device;
    TensorParallelModel model(load_model_config(model_dir), options);
    ReloadableModel served(model, WeightLocation{model_dir, "", ""}, plane.transport.get());

    // Derived from the weights: answers already computed. A reload drops them.
    std::map<std::pair<Tokens, int>, Tokens> answers;
    served.on_reloaded([&](const ReloadResult&) { answers.clear(); });

    ReloadOptions reload;
    reload.bucket_bytes = static_cast<std::uint64_t>(bucket_mb * 1048576);
    served.reload(world, reload);  // the first load: from the model directory
    auto say = [&](const std::string& line) {
      if (world.rank() == 0) std::cout << line << std::endl;
    };
    say("serving " + served.location().path + " on " + std::to_string(world.size()) +
        " rank(s), tp " + std::to_string(world.size()) + " (" + plane.describe() + ")");

    while (const auto line = next_request(world, in)) {
      std::istringstream words(*line);
      std::string verb;
      words >> verb;
      if (verb == "quit") break;
      if (verb == "generate") {
        int count = 0;
        Tokens prompt;
        words >> count;
        for (std::int64_t t; words >> t;) prompt.push_back(t);
        if (count <= 0 || prompt.empty()) {
          say("error: usage: generate N T1 T2 ...");
          continue;
        }
        auto key = std::make_pair(prompt, count);
        const bool cached = answers.count(key) > 0;
        if (!cached) answers[key] = generate(model, world, prompt, count);
        say("answer: " + text(prompt) + " -> " + text(answers[key]) +
            (cached ? " (cached)" : " (computed)"));
      } else if (verb == "reload") {
        std::string path;
        words >> path;
        try {
          const ReloadResult r = served.reload(world, reload, path);
          std::ostringstream out;
          out << "reloaded " << r.loaded.size() << " parameters from " << served.location().path
              << " in " << r.seconds.total << " s (" << (r.complete() ? "complete" : "INCOMPLETE")
              << "); answer cache dropped";
          say(out.str());
        } catch (const std::exception& e) {
          if (!dynamic_cast<const AgreedError*>(&e)) throw;  // this rank's alone: end the job
          say(std::string("reload failed on every rank: ") + e.what());
        }
      } else {
        say("error: unknown request '" + verb + "' (generate, reload, quit)");
      }
    }
    say("bye");
    return 0;
  });
}
