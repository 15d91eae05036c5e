// Launch settings: which rank controls, the job token, where the controller listens.
#include "hybridflow/transport/launcher.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <sys/stat.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "hybridflow/core/error.h"

extern char** environ;

namespace hybridflow {
namespace {

using Env = std::map<std::string, std::string>;

std::string value_of(const Env& env, const std::string& key) {
  auto it = env.find(key);
  return it == env.end() ? std::string() : it->second;
}

int int_of(const Env& env, const std::string& key, int fallback, int lo, int hi) {
  const std::string text = value_of(env, key);
  if (text.empty()) return fallback;
  errno = 0;
  char* end = nullptr;
  long v = std::strtol(text.c_str(), &end, 10);
  HF_CHECK(end == text.c_str() + text.size() && errno == 0 && v >= lo && v <= hi, "launch environment: ", key, "=",
           text, " must be an integer in [", lo, ", ", hi, "]");
  return static_cast<int>(v);
}

std::string octal_mode(unsigned mode) {
  char text[8];
  std::snprintf(text, sizeof(text), "%03o", mode & 0777);
  return text;
}

// The job secret every rank shares: from HF_JOB_TOKEN or the file HF_JOB_TOKEN_FILE names. Launcher job
// ids (torchrun run id, Slurm job id, ...) are guessable, so they are never used for it.
std::pair<std::string, std::string> job_secret(const Env& env, const std::string& launcher, int world) {
  const std::string direct = value_of(env, "HF_JOB_TOKEN");
  const std::string file = value_of(env, "HF_JOB_TOKEN_FILE");
  HF_CHECK(direct.empty() || file.empty(), "launch environment: both HF_JOB_TOKEN and HF_JOB_TOKEN_FILE are set; "
           "set one");
  if (!direct.empty()) return {direct, "HF_JOB_TOKEN"};
  HF_CHECK(!file.empty(), "launch environment (", launcher, ", world_size ", world, "): no job secret: write one "
           "with `openssl rand -hex 32 > ~/.hf_job_token; chmod 600 ~/.hf_job_token` and export "
           "HF_JOB_TOKEN_FILE=<that file> (or HF_JOB_TOKEN=<the secret>) on every rank; see docs/cluster.md");
  struct stat st {};
  HF_CHECK(::stat(file.c_str(), &st) == 0, "launch environment: HF_JOB_TOKEN_FILE=", file, " cannot be read: ",
           std::strerror(errno));
  // Like ssh with its keys: a secret others on the machine can read is not a secret.
  HF_CHECK((st.st_mode & 077) == 0, "launch environment: HF_JOB_TOKEN_FILE=", file, " is readable by other users "
           "(mode ", octal_mode(st.st_mode), "); run chmod 600 ", file);
  std::ifstream in(file, std::ios::binary);
  HF_CHECK(in.good(), "launch environment: HF_JOB_TOKEN_FILE=", file, " cannot be opened");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  return {text, "HF_JOB_TOKEN_FILE=" + file};
}

std::string resolve_ipv4(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
  HF_CHECK(rc == 0 && found != nullptr, "launch environment: MASTER_ADDR=", host,
           " does not resolve to an IPv4 address (", ::gai_strerror(rc), "); set HF_BIND_ADDR to the address the "
           "controller should listen on");
  char text[INET_ADDRSTRLEN] = {0};
  ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr, text, sizeof(text));
  ::freeaddrinfo(found);
  return text;
}

}  // namespace

std::string LaunchSettings::endpoint(int port) const {
  return "tcp://" + env.master_addr + ":" + std::to_string(port);
}

void check_job_secret(const std::string& secret, const std::string& source) {
  // Secrets printed in documentation (this project's and others') are known to everyone.
  static const char* kKnown[] = {"2f6c0e3d9a7b41c8", "0123456789abcdef0123456789abcdef",
                                 "00000000000000000000000000000000"};
  HF_CHECK(secret.size() >= kMinJobSecretChars, source, ": the job secret has ", secret.size(),
           " characters; at least ", kMinJobSecretChars, " are required (e.g. `openssl rand -hex 32`)");
  for (const char* known : kKnown)
    HF_CHECK(secret.find(known) == std::string::npos, source, ": the job secret contains a well-known example "
             "value; generate your own (e.g. `openssl rand -hex 32`)");
  size_t distinct = 0;
  for (int c = 0; c < 256; ++c) distinct += secret.find(static_cast<char>(c)) != std::string::npos;
  HF_CHECK(distinct >= 8, source, ": the job secret uses only ", distinct, " distinct characters; generate a "
           "random one (e.g. `openssl rand -hex 32`)");
}

bool pool_env_key_allowed(const std::string& key) {
  // Thread counts and device selection: what a pool's worker environment is for. Anything else (PATH,
  // LD_PRELOAD, NCCL plugins, ...) would let whoever speaks for the controller run code on the worker.
  static const char* kAllowed[] = {"OMP_NUM_THREADS",   "OMP_WAIT_POLICY",    "OMP_PROC_BIND",
                                   "OMP_PLACES",        "MKL_NUM_THREADS",    "OPENBLAS_NUM_THREADS",
                                   "CUDA_VISIBLE_DEVICES", "TOKENIZERS_PARALLELISM", "LOCAL_RANK"};
  for (const char* allowed : kAllowed)
    if (key == allowed) return true;
  return false;
}

LaunchSettings launch_settings_from(const Env& env) {
  LaunchSettings s;
  s.env = launch_env_from(env);
  if (!s.multi_rank()) return s;
  const int world = s.env.world_size;
  s.controller_rank = int_of(env, "HF_CONTROLLER_RANK", 0, 0, world - 1);
  std::tie(s.token, s.token_source) = job_secret(env, s.env.launcher, world);
  check_job_secret(s.token, s.token_source);
  const bool agent_store = value_of(env, "TORCHELASTIC_USE_AGENT_STORE") == "True";
  s.rendezvous_port = int_of(env, "HF_RENDEZVOUS_PORT", s.env.master_port + (agent_store ? 1 : 0), 1, 65535);
  s.pool_port_base = int_of(env, "HF_POOL_PORT_BASE", 0, 0, 65535);
  const std::string timeout = value_of(env, "HF_HEARTBEAT_TIMEOUT_S");
  if (!timeout.empty()) {
    char* end = nullptr;
    s.heartbeat_timeout_s = std::strtod(timeout.c_str(), &end);
    HF_CHECK(end == timeout.c_str() + timeout.size() && s.heartbeat_timeout_s > 0,
             "launch environment: HF_HEARTBEAT_TIMEOUT_S=", timeout, " must be a positive number of seconds");
  }
  s.bind_addr = value_of(env, "HF_BIND_ADDR");
  // Only the controller listens, so only it needs MASTER_ADDR to name one of its own interfaces.
  if (s.bind_addr.empty() && s.is_controller()) s.bind_addr = resolve_ipv4(s.env.master_addr);
  return s;
}

const LaunchSettings& launch_settings() {
  static std::once_flag once;
  static std::unique_ptr<LaunchSettings> settings;
  std::call_once(once, [] {
    Env env;
    for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
      std::string text(*entry);
      size_t eq = text.find('=');
      if (eq != std::string::npos) env[text.substr(0, eq)] = text.substr(eq + 1);
    }
    settings = std::make_unique<LaunchSettings>(launch_settings_from(env));
  });
  return *settings;
}

}  // namespace hybridflow
