/* The first process of the emulated machine (scripts/avx512-emu/run.sh): runs each
   line of /cmds (a program and its arguments, split at spaces, after any NAME=value
   words for its environment) one after the other, prints each exit status and a last
   line saying whether all of them passed, then asks Bochs to stop (the string
   "Shutdown" on its I/O port 0x8900). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/io.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <termios.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

int main(void) {
  /* An initramfs packed without root has no device nodes: devtmpfs gives them, the
     console when the kernel found none, and /dev/urandom, where static binaries read
     their random seeds (they cannot look up libc's getrandom). */
  mkdir("/dev", 0755);
  mount("devtmpfs", "/dev", "devtmpfs", 0, 0);
  if (fcntl(1, F_GETFD) == -1) {
    int fd = open("/dev/console", O_RDWR);
    if (fd >= 0) {
      dup2(fd, 0);
      dup2(fd, 1);
      dup2(fd, 2);
    }
  }
  mkdir("/proc", 0755);
  mount("proc", "/proc", "proc", 0, 0);
  unsigned a, b, c, d;
  __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
  printf("EMU: cpuid avx512f=%u avx512dq=%u avx512bw=%u avx512vl=%u\n", (b >> 16) & 1,
         (b >> 17) & 1, (b >> 30) & 1, (b >> 31) & 1);
  fflush(stdout);
  setenv("RUST_BACKTRACE", "1", 1);
  setenv("HOME", "/", 1);
  FILE *f = fopen("/cmds", "r");
  char line[4096];
  int failed = 0, ran = 0;
  while (f && fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = 0;
    if (!line[0]) continue;
    char words[4096];
    strcpy(words, line);
    char *argv[128], *env[32];
    int n = 0, e = 0;
    for (char *t = strtok(words, " "); t && n < 127; t = strtok(0, " ")) {
      if (n == 0 && e < 31 && t[0] != '/' && strchr(t, '='))
        env[e++] = t;
      else
        argv[n++] = t;
    }
    argv[n] = 0;
    env[e] = 0;
    printf("EMU: run %s\n", line);
    fflush(stdout);
    pid_t p = fork();
    if (p == 0) {
      for (int i = 0; i < e; i++) putenv(env[i]);
      execv(argv[0], argv);
      perror("exec");
      _exit(127);
    }
    int st = 0;
    waitpid(p, &st, 0);
    int code = WIFEXITED(st) ? WEXITSTATUS(st) : 1000 + WTERMSIG(st);
    failed |= code != 0;
    ran++;
    printf("EMU: exit %d: %s\n", code, line);
    fflush(stdout);
  }
  printf("EMU: done: %d commands, %s\n", ran, failed || !ran ? "FAILED" : "all passed");
  fflush(stdout);
  /* Bochs stops at once: let the serial port send what the console still holds. */
  tcdrain(1);
  sleep(2);
  if (ioperm(0x8900, 1, 1) == 0) {
    for (const char *s = "Shutdown"; *s; s++) outb(*s, 0x8900);
  }
  for (;;) pause();
}
