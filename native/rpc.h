// llama.cpp's RPC backend, reached through ggml's backend registry as llama.cpp's own tools
// do: a llama.cpp built without it still loads, and these calls say so.
#pragma once

#include <string>
#include <vector>

#include "ggml-backend.h"

// Registers a running rpc-server's devices, so models loaded from now on can use them.
// Throws std::runtime_error when the build has no RPC backend or the server has no device.
std::vector<ggml_backend_dev_t> rpc_add_server(const std::string & endpoint);

// Serves this machine's devices (its GPUs, else its CPU with n_threads) at endpoint until the
// process ends; returns only when it could not start listening.
void rpc_serve(const std::string & endpoint, const std::string & cache_dir, int n_threads);

// This machine's GPUs (no RPC devices): a draft model stays local. Empty: CPU only.
std::vector<ggml_backend_dev_t> local_gpus();

// ggml_backend_init_best() without RPC devices (which register as GPUs): a local GPU, else an
// integrated one, else the CPU. For drafters, which stay on this machine.
ggml_backend_t local_best_backend();

// TCP keepalive on every socket this process holds to one of `endpoints` (host:port, as
// given), so a server that vanished ends the wait on it within idle + interval * count
// seconds instead of never. Returns the sockets set.
int rpc_keepalive(const std::vector<std::string> & endpoints, int idle, int interval, int count);

// ggml aborts the process when an RPC connection fails mid-call (it cannot recover one). From
// now on such an abort gives back a terminal a full-screen app took over (as remember_terminal
// found it), prints `localspec: <what>` on one line to stderr (and to the terminal when the
// app had sent stderr to its log), and exits with status 1 instead of dumping a backtrace.
void rpc_exit_cleanly_on_abort();
void remember_terminal();
