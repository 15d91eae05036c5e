// verl's custom_reward_function: a Python file's compute_score, run as a reward command through a small adapter
// that imports it (as verl's load_extern_object does: a file path, file:// or pkg://) and calls it once per
// sample with verl's keyword arguments and reward_kwargs, so a verl config's scorer runs unchanged.
#include <filesystem>

#include "hybridflow/core/config_json.h"
#include "hybridflow/core/error.h"
#include "run_spec_builders.h"

namespace hybridflow {

namespace {

// argv: the module path, the function's name, reward_kwargs as JSON. A dict result gives its "score" (its other
// keys are verl's reward_extra_info, not read here); a coroutine function is awaited, as verl does.
constexpr const char* kAdapter = R"PY(import asyncio, importlib, importlib.util, inspect, json, os, sys
path, name, kwargs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
if path.startswith("pkg://"):
    module = importlib.import_module(path[len("pkg://"):].replace("/", "."))
else:
    if path.startswith("file://"):
        path = path[len("file://"):]
    spec = importlib.util.spec_from_file_location("custom_reward_function", path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    spec.loader.exec_module(module)
if not hasattr(module, name):
    sys.exit(f"custom_reward_function.name: {sys.argv[1]} has no function {name!r}")
fn = getattr(module, name)
for line in sys.stdin:
    s = json.loads(line)
    r = fn(data_source=s["data_source"], solution_str=s["response"], ground_truth=s["ground_truth"],
           extra_info=s["extra_info"], **kwargs)
    if inspect.isawaitable(r):
        r = asyncio.run(r)
    print(json.dumps({"score": float(r["score"] if isinstance(r, dict) else r)}), flush=True)
)PY";

}  // namespace

std::optional<RewardFunctionSpec> custom_reward_function_spec(const ConfigReader& c, const RewardFunctionSpec& reward) {
  const ConfigReader custom = c.subtree("custom_reward_function");
  for (const char* key : {"name", "reward_kwargs", "python"}) custom.note(key);
  if (custom.is_null("path")) return std::nullopt;
  const std::string path = custom.get<std::string>("path");
  const std::string file = path.rfind("file://", 0) == 0 ? path.substr(7) : path;
  HF_CHECK(path.rfind("pkg://", 0) == 0 || std::filesystem::is_regular_file(file),
           "custom_reward_function.path: no file ", file, " (a Python file with compute_score, or pkg://module)");
  HF_CHECK(reward.type == "task" && !reward.task && c.config().is_default("reward.type"),
           "custom_reward_function.path and reward.type = ", reward.type,
           " both choose the reward: set one (custom_reward_function runs the file as a reward command)");
  const std::string name = custom.get<std::string>("name");
  HF_CHECK(!name.empty(), "custom_reward_function.name: expected the function's name (verl's default compute_score)");
  const std::string python = custom.get<std::string>("python");
  HF_CHECK(!python.empty(), "custom_reward_function.python: expected a Python interpreter (default python3)");
  RewardFunctionSpec f = reward;  // reward.timeout_s and max_output_bytes bound it as any command
  f.section = "custom_reward_function";
  f.type = "command";
  f.command = std::vector<std::string>{python, "-c", kAdapter, path, name,
                                       config_to_json(custom.config().subtree("reward_kwargs")).dump()};
  f.shell.reset();
  f.url.reset();
  return f;
}

}  // namespace hybridflow
