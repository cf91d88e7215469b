/* it_tunnel_lo.c: a reverse tunnel on a loopback name holds the port on 127.0.0.1 and ::1 both,
 * or is refused, never half-bound (issue 17.7). The squatter runs as nobody. */
#include "harness.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

static const char *sock;
static pid_t shim_pid;

static struct sbx_client *start(void)
{
	sock = it_path("s.sock");
	shim_pid = it_daemon_start("shim", "--listen", it_unix_target(sock), "--state-dir", it_path("state"),
				   "--log-level", "debug", NULL)
			   ->pid;
	return it_connect(it_unix_target(sock), NULL);
}

static bool have_v6_loopback(void)
{
	int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return false;
	struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
	bool ok = bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
	close(fd);
	return ok;
}

static bool can_nobody(void)
{
	return geteuid() == 0 && access("/usr/bin/setpriv", X_OK) == 0 && access("/usr/bin/python3", X_OK) == 0;
}

/* As nobody: python3 binds ADDR:PORT (family by the address) and listens, then prints
 * "bound" (or "errno N") and, with hold, waits for its stdin to close. */
static const char nobody_bind_py[] = "import socket, sys\n"
				     "addr, port, hold = sys.argv[1], int(sys.argv[2]), sys.argv[3] == '1'\n"
				     "fam = socket.AF_INET6 if ':' in addr else socket.AF_INET\n"
				     "s = socket.socket(fam, socket.SOCK_STREAM)\n"
				     "if fam == socket.AF_INET6:\n"
				     "    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)\n"
				     "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
				     "try:\n"
				     "    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)\n"
				     "    s.bind((addr, port)); s.listen(8)\n"
				     "except OSError as e:\n"
				     "    print('errno', e.errno, flush=True); sys.exit(0)\n"
				     "print('bound', s.getsockname()[1], flush=True)\n"
				     "if hold:\n"
				     "    sys.stdin.read()\n";

struct squatter {
	pid_t pid;
	int in, out;
	char line[64];
};

static void nobody_bind(struct squatter *q, const char *addr, unsigned port, bool hold)
{
	int pin[2], pout[2];
	CHECK(pipe2(pin, O_CLOEXEC) == 0 && pipe2(pout, O_CLOEXEC) == 0);
	char ps[16];
	snprintf(ps, sizeof(ps), "%u", port);
	q->pid = fork();
	CHECK(q->pid >= 0);
	if (q->pid == 0) {
		dup2(pin[0], 0);
		dup2(pout[1], 1);
		execl("/usr/bin/setpriv", "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
		      "/usr/bin/python3", "-c", nobody_bind_py, addr, ps, hold ? "1" : "0", (char *)NULL);
		_exit(127);
	}
	close(pin[0]);
	close(pout[1]);
	q->in = pin[1];
	q->out = pout[0];
	size_t n = 0;
	uint64_t deadline = it_now_ms() + 10000;
	while (n == 0 || q->line[n - 1] != '\n') {
		struct pollfd pf = {.fd = q->out, .events = POLLIN};
		CHECKF(it_now_ms() < deadline, "the squatter said nothing");
		if (poll(&pf, 1, 100) <= 0)
			continue;
		ssize_t r = read(q->out, q->line + n, sizeof(q->line) - 1 - n);
		CHECKF(r > 0, "the squatter ended without a word");
		n += (size_t)r;
		CHECK(n < sizeof(q->line) - 1);
	}
	q->line[n] = '\0';
	if (!hold)
		CHECK(waitpid(q->pid, NULL, 0) == q->pid);
}

static void squatter_end(struct squatter *q)
{
	close(q->in);
	CHECK(waitpid(q->pid, NULL, 0) == q->pid);
	close(q->out);
}

/* Does binding ADDR:PORT ourselves (root, no SO_REUSEPORT) work right now? */
static bool can_bind(const char *addr, unsigned port)
{
	struct sockaddr_storage ss;
	memset(&ss, 0, sizeof(ss));
	socklen_t sl;
	int fam = strchr(addr, ':') ? AF_INET6 : AF_INET;
	if (fam == AF_INET6) {
		struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
		a->sin6_family = AF_INET6;
		a->sin6_port = htons((uint16_t)port);
		CHECK(inet_pton(AF_INET6, addr, &a->sin6_addr) == 1);
		sl = sizeof(*a);
	} else {
		struct sockaddr_in *a = (struct sockaddr_in *)&ss;
		a->sin_family = AF_INET;
		a->sin_port = htons((uint16_t)port);
		CHECK(inet_pton(AF_INET, addr, &a->sin_addr) == 1);
		sl = sizeof(*a);
	}
	int fd = socket(fam, SOCK_STREAM | SOCK_CLOEXEC, 0);
	CHECK(fd >= 0);
	int one = 1;
	if (fam == AF_INET6)
		setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
	bool ok = bind(fd, (struct sockaddr *)&ss, sl) == 0 && listen(fd, 1) == 0;
	close(fd);
	return ok;
}

/* Whether the shim has a TCP socket listening on ADDR:PORT: a LISTEN line of
 * /proc/net/tcp{,6} for that address whose inode is one of the shim's fds. "Not bound
 * by the tunnel" is asked this way, not by binding the port here: on a busy machine
 * another program's connection may use the same port number on the other address. */
static bool shim_listens(const char *addr, unsigned port)
{
	bool v6 = strchr(addr, ':') != NULL;
	unsigned char a[16];
	CHECK(inet_pton(v6 ? AF_INET6 : AF_INET, addr, a) == 1);
	/* the kernel prints the address as 32-bit words in host order, in hex */
	char want[40] = "";
	for (int w = 0; w < (v6 ? 4 : 1); w++) {
		uint32_t x;
		memcpy(&x, a + 4 * w, 4);
		char h[9];
		snprintf(h, sizeof(h), "%08X", x);
		strcat(want, h);
	}
	char wantp[8];
	snprintf(wantp, sizeof(wantp), "%04X", port);
	FILE *f = fopen(v6 ? "/proc/net/tcp6" : "/proc/net/tcp", "re");
	CHECK(f != NULL);
	char line[512];
	unsigned long inodes[16];
	size_t n = 0;
	while (fgets(line, sizeof(line), f) && n < 16) {
		char local[64], st[8];
		unsigned long ino;
		if (sscanf(line, " %*s %63s %*s %7s %*s %*s %*s %*s %*s %lu", local, st, &ino) != 3)
			continue; /* the header */
		char *colon = strchr(local, ':');
		if (!colon || strcmp(st, "0A") != 0)
			continue;
		*colon = '\0';
		if (strcmp(local, want) == 0 && strcmp(colon + 1, wantp) == 0)
			inodes[n++] = ino;
	}
	fclose(f);
	for (size_t i = 0; i < n; i++) {
		char sockname[64];
		snprintf(sockname, sizeof(sockname), "socket:[%lu]", inodes[i]);
		char dir[64];
		snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)shim_pid);
		DIR *d = opendir(dir);
		CHECK(d != NULL);
		struct dirent *e;
		bool found = false;
		while (!found && (e = readdir(d))) {
			char lp[320], tgt[64];
			snprintf(lp, sizeof(lp), "%s/%s", dir, e->d_name);
			ssize_t k = readlink(lp, tgt, sizeof(tgt) - 1);
			if (k > 0) {
				tgt[k] = '\0';
				found = strcmp(tgt, sockname) == 0;
			}
		}
		closedir(d);
		if (found)
			return true;
	}
	return false;
}

/* A port free on both loopback addresses, as nobody's squatter will then take it. */
static unsigned free_port(void)
{
	for (int i = 0; i < 100; i++) {
		int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
		socklen_t l = sizeof(a);
		CHECK(bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
		      getsockname(fd, (struct sockaddr *)&a, &l) == 0);
		close(fd);
		unsigned p = ntohs(a.sin_port);
		if (can_bind("::1", p))
			return p;
	}
	it_fail(__FILE__, __LINE__, "no port free on both loopback addresses");
}

/* nobody holds [::1]:PORT: a reverse tunnel on localhost:PORT is refused with
 * EADDRINUSE naming [::1]:PORT, and 127.0.0.1:PORT is not left bound. The same with
 * 127.0.0.1 held, and with no host at all (the default is localhost). */
static int case_prebound(void)
{
	if (!can_nobody() || !have_v6_loopback())
		return IT_SKIP;
	struct sbx_client *c = start();
	struct sbx_error err;
	static const char *const held[] = {"::1", "127.0.0.1"};
	static const char *const hosts[] = {"localhost", NULL};
	for (size_t h = 0; h < ARRAY_LEN(held); h++) {
		for (size_t k = 0; k < ARRAY_LEN(hosts); k++) {
			unsigned port = free_port();
			struct squatter q;
			nobody_bind(&q, held[h], port, true);
			CHECKF(strncmp(q.line, "bound", 5) == 0, "nobody could not bind %s:%u: %s", held[h], port,
			       q.line);
			struct sbx_tunnel *t = NULL;
			CHECK(sbx_reverse_open(c, hosts[k], port, NULL, 1, NULL, &t, &err) < 0);
			CHECK_ERR(&err, SBX_ERR_REMOTE, EADDRINUSE);
			char want[80];
			snprintf(want, sizeof(want), strchr(held[h], ':') ? "[%s]:%u" : "%s:%u", held[h], port);
			CHECKF(strcmp(err.path, want) == 0, "the error names '%s', want '%s'", err.path, want);
			CHECK(t == NULL);
			/* not half-bound: the other address is free */
			const char *other = h == 0 ? "127.0.0.1" : "::1";
			CHECKF(!shim_listens(other, port), "%s:%u was left bound by the refused tunnel", other, port);
			squatter_end(&q);
			printf("%s held by nobody: tunnel on %s:%u refused (%s), %s free\n", want,
			       hosts[k] ? hosts[k] : "(default)", port, err.message, other);
		}
	}
	sbx_client_close(c);
	return 0;
}

/* Once the tunnel holds localhost:PORT, nobody cannot take the port on ::1, on
 * 127.0.0.1, or on either wildcard (even with SO_REUSEPORT); 127.0.0.2 is another
 * address (documented: only clients that connect to 127.0.0.2 reach it). Both
 * addresses accept for the tunnel. */
static int case_held(void)
{
	if (!can_nobody() || !have_v6_loopback())
		return IT_SKIP;
	struct sbx_client *c = start();
	struct sbx_error err;
	struct sbx_tunnel *t;
	CHECK_SBX(sbx_reverse_open(c, "localhost", 0, NULL, 1, NULL, &t, &err), &err);
	unsigned port = sbx_tunnel_port(t);
	CHECK(shim_listens("127.0.0.1", port) && shim_listens("::1", port));
	static const char *const addrs[] = {"::1", "127.0.0.1", "0.0.0.0", "::"};
	for (size_t i = 0; i < ARRAY_LEN(addrs); i++) {
		struct squatter q;
		nobody_bind(&q, addrs[i], port, false);
		char want[32];
		snprintf(want, sizeof(want), "errno %d\n", EADDRINUSE);
		CHECKF(strcmp(q.line, want) == 0, "nobody binding %s:%u: '%s', want EADDRINUSE", addrs[i], port,
		       q.line);
	}
	struct squatter q;
	nobody_bind(&q, "127.0.0.2", port, false);
	CHECKF(strncmp(q.line, "bound", 5) == 0, "127.0.0.2:%u: %s", port, q.line);
	struct sbx_tunnel_info **v;
	size_t n;
	CHECK_SBX(sbx_tunnels_list(c, NULL, &v, &n, &err), &err);
	CHECK_EQ(n, 1);
	CHECK(strcmp(v[0]->host, "localhost") == 0);
	CHECK_EQ(v[0]->port, port);
	sbx_tunnels_free(v);
	/* both accept: connections reach the listener (and wait to be claimed) */
	static const int fams[] = {AF_INET, AF_INET6};
	for (size_t i = 0; i < ARRAY_LEN(fams); i++) {
		int fd = socket(fams[i], SOCK_STREAM | SOCK_CLOEXEC, 0);
		struct sockaddr_storage ss;
		memset(&ss, 0, sizeof(ss));
		socklen_t sl;
		if (fams[i] == AF_INET) {
			struct sockaddr_in *a = (struct sockaddr_in *)&ss;
			a->sin_family = AF_INET;
			a->sin_port = htons((uint16_t)port);
			a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
			sl = sizeof(*a);
		} else {
			struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
			a->sin6_family = AF_INET6;
			a->sin6_port = htons((uint16_t)port);
			a->sin6_addr = in6addr_loopback;
			sl = sizeof(*a);
		}
		CHECKF(connect(fd, (struct sockaddr *)&ss, sl) == 0, "connect to the tunnel (%s): %s",
		       fams[i] == AF_INET ? "127.0.0.1" : "::1", strerror(errno));
		close(fd);
	}
	sbx_tunnel_close(t);
	/* closed: both addresses are free again */
	uint64_t deadline = it_now_ms() + 5000;
	while (shim_listens("127.0.0.1", port) || shim_listens("::1", port)) {
		CHECKF(it_now_ms() < deadline, "port %u still held after the tunnel closed", port);
		it_sleep_ms(10);
	}
	/* ip6-localhost: ::1 only */
	CHECK_SBX(sbx_reverse_open(c, "ip6-localhost", 0, NULL, 1, NULL, &t, &err), &err);
	CHECK(!can_bind("::1", sbx_tunnel_port(t)) && shim_listens("::1", sbx_tunnel_port(t)));
	CHECK(!shim_listens("127.0.0.1", sbx_tunnel_port(t)));
	sbx_tunnel_close(t);
	/* a numeric address binds that address only */
	CHECK_SBX(sbx_reverse_open(c, "127.0.0.1", 0, NULL, 1, NULL, &t, &err), &err);
	CHECK(shim_listens("127.0.0.1", sbx_tunnel_port(t)) && !shim_listens("::1", sbx_tunnel_port(t)));
	sbx_tunnel_close(t);
	sbx_client_close(c);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct it_case cases[] = {
		{"prebound", case_prebound},
		{"held", case_held},
	};
	return it_main(argc, argv, cases, ARRAY_LEN(cases));
}
