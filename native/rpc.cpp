#include "rpc.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#ifndef _WIN32
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <termios.h>
#include <unistd.h>
#endif

namespace {

ggml_backend_reg_t rpc_registry() {
    ggml_backend_reg_t reg = ggml_backend_reg_by_name("RPC");
    if (!reg) {
        throw std::runtime_error("this llama.cpp build has no RPC backend: rebuild llama-cpp-python "
                                 "with CMAKE_ARGS=-DGGML_RPC=on (./dev rebuild does)");
    }
    return reg;
}

template <typename F>
F rpc_function(const char * name) {
    auto f = reinterpret_cast<F>(ggml_backend_reg_get_proc_address(rpc_registry(), name));
    if (!f) {
        throw std::runtime_error(std::string("this llama.cpp's RPC backend has no ") + name);
    }
    return f;
}

bool split_endpoint(const std::string & endpoint, std::string & host, std::string & port) {
    auto colon = endpoint.rfind(':');
    if (colon == std::string::npos) return false;
    host = endpoint.substr(0, colon);
    port = endpoint.substr(colon + 1);
    return !host.empty() && !port.empty();
}

#ifndef _WIN32
struct termios g_terminal;
bool g_have_terminal = false;

void exit_on_rpc_abort(const char * message) {
    if (!std::strstr(message, "RPC") && !std::strstr(message, "connect to")) {
        std::fprintf(stderr, "%s\n", message);  // not ours: ggml aborts as it would
        return;
    }
    if (g_have_terminal) {
        // Leave the alternate screen, show the cursor, wrap lines, stop mouse and paste reporting.
        static const char reset[] = "\x1b[?1049l\x1b[?25h\x1b[?7h\x1b[?1000l\x1b[?1002l\x1b[?1003l\x1b[?1006l\x1b[?2004l";
        if (write(STDOUT_FILENO, reset, sizeof reset - 1) < 0) {}
        tcsetattr(STDIN_FILENO, TCSANOW, &g_terminal);
    }
    const char * what = std::strrchr(message, ':');  // past ggml's "file:line: "
    char line[512];
    int n = std::snprintf(line, sizeof line, "localspec: lost the connection to an rpc-server (%s); the "
                          "request did not finish\n", what ? what + 2 : message);
    n = std::min(n, int(sizeof line) - 1);
    if (write(STDERR_FILENO, line, n) < 0) {}
    if (g_have_terminal && !isatty(STDERR_FILENO)) {  // a full-screen app sent stderr to its log
        int tty = open("/dev/tty", O_WRONLY | O_NOCTTY);
        if (tty >= 0 && write(tty, line, n) < 0) {}
    }
    _exit(1);
}
#endif

}  // namespace

std::vector<ggml_backend_dev_t> rpc_add_server(const std::string & endpoint) {
    using add_server_t = ggml_backend_reg_t (*)(const char *);
    ggml_backend_reg_t reg = rpc_function<add_server_t>("ggml_backend_rpc_add_server")(endpoint.c_str());
    if (!reg || ggml_backend_reg_dev_count(reg) == 0) {
        throw std::runtime_error("the rpc-server at " + endpoint + " offers no device");
    }
    ggml_backend_register(reg);  // llama.cpp registers the same reg once per endpoint
    std::vector<ggml_backend_dev_t> devices;
    for (size_t i = 0; i < ggml_backend_reg_dev_count(reg); i++) {
        devices.push_back(ggml_backend_reg_dev_get(reg, i));
    }
    return devices;
}

std::vector<ggml_backend_dev_t> local_gpus() {
    std::vector<ggml_backend_dev_t> gpus;
    for (size_t i = 0; i < ggml_backend_dev_count(); i++) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        auto type = ggml_backend_dev_type(dev);
        bool rpc = std::strcmp(ggml_backend_reg_name(ggml_backend_dev_backend_reg(dev)), "RPC") == 0;
        if (!rpc && (type == GGML_BACKEND_DEVICE_TYPE_GPU || type == GGML_BACKEND_DEVICE_TYPE_IGPU)) {
            gpus.push_back(dev);
        }
    }
    return gpus;
}

ggml_backend_t local_best_backend() {
    const std::vector<ggml_backend_dev_t> gpus = local_gpus();
    auto discrete = std::find_if(gpus.begin(), gpus.end(), [](ggml_backend_dev_t dev) {
        return ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_GPU;
    });
    ggml_backend_dev_t dev = discrete != gpus.end() ? *discrete
                           : !gpus.empty()          ? gpus.front()
                                                    : ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    return dev ? ggml_backend_dev_init(dev, nullptr) : nullptr;
}

void rpc_serve(const std::string & endpoint, const std::string & cache_dir, int n_threads) {
    using start_server_t = void (*)(const char *, const char *, size_t, size_t, ggml_backend_dev_t *);
    auto start = rpc_function<start_server_t>("ggml_backend_rpc_start_server");
    std::vector<ggml_backend_dev_t> devices = local_gpus();  // as llama.cpp's rpc-server picks
    if (devices.empty()) {
        devices.push_back(ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU));
    }
    start(endpoint.c_str(), cache_dir.empty() ? nullptr : cache_dir.c_str(), n_threads, devices.size(),
          devices.data());
}

int rpc_keepalive(const std::vector<std::string> & endpoints, int idle, int interval, int count) {
#ifdef _WIN32
    return 0;
#else
    std::vector<sockaddr_storage> peers;
    for (const auto & endpoint : endpoints) {
        std::string host, port;
        addrinfo hints{}, * found = nullptr;
        hints.ai_socktype = SOCK_STREAM;
        if (!split_endpoint(endpoint, host, port) || getaddrinfo(host.c_str(), port.c_str(), &hints, &found)) {
            continue;
        }
        for (addrinfo * a = found; a; a = a->ai_next) {
            sockaddr_storage s{};
            std::memcpy(&s, a->ai_addr, a->ai_addrlen);
            peers.push_back(s);
        }
        freeaddrinfo(found);
    }
    auto same = [](const sockaddr_storage & a, const sockaddr_storage & b) {
        if (a.ss_family != b.ss_family) return false;
        if (a.ss_family == AF_INET) {
            auto & x = reinterpret_cast<const sockaddr_in &>(a);
            auto & y = reinterpret_cast<const sockaddr_in &>(b);
            return x.sin_port == y.sin_port && x.sin_addr.s_addr == y.sin_addr.s_addr;
        }
        auto & x = reinterpret_cast<const sockaddr_in6 &>(a);
        auto & y = reinterpret_cast<const sockaddr_in6 &>(b);
        return x.sin6_port == y.sin6_port && std::memcmp(&x.sin6_addr, &y.sin6_addr, sizeof x.sin6_addr) == 0;
    };
    rlimit limit{};
    getrlimit(RLIMIT_NOFILE, &limit);
    int n_fds = limit.rlim_cur == RLIM_INFINITY || limit.rlim_cur > 65536 ? 65536 : (int) limit.rlim_cur;
    int n_set = 0, on = 1;
    for (int fd = 0; fd < n_fds; fd++) {
        int type = 0;
        socklen_t len = sizeof type;
        sockaddr_storage peer{};
        socklen_t peer_len = sizeof peer;
        if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM ||
                getpeername(fd, reinterpret_cast<sockaddr *>(&peer), &peer_len) != 0) {
            continue;
        }
        bool ours = false;
        for (const auto & p : peers) ours = ours || same(p, peer);
        if (!ours) continue;
        setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
#ifdef TCP_KEEPIDLE
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
#elif defined(TCP_KEEPALIVE)
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPALIVE, &idle, sizeof idle);
#endif
#ifdef TCP_KEEPINTVL
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
#endif
#ifdef TCP_USER_TIMEOUT
        // Data sent and never acknowledged (a peer gone mid-transfer) gives up as soon.
        unsigned int ms = 1000u * (idle + interval * count);
        setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ms, sizeof ms);
#endif
        n_set++;
    }
    return n_set;
#endif
}

void remember_terminal() {
#ifndef _WIN32
    g_have_terminal = isatty(STDIN_FILENO) && tcgetattr(STDIN_FILENO, &g_terminal) == 0;
#endif
}

void rpc_exit_cleanly_on_abort() {
#ifndef _WIN32
    ggml_set_abort_callback(exit_on_rpc_abort);
#endif
}
