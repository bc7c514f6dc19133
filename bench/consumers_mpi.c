/* consumers_mpi: the MPI timings of bench/consumers.sh (issue 27), built there with mpicc.openmpi.
 * Each argument is one test, run in order by every rank:
 *   pingpong:SIZE:ITERS    rank 0 <-> rank N-1, blocking MPI_Send/MPI_Recv; prints the half round
 *                          trip in µs (one-way, as perftest and qperf report latency)
 *   bandwidth:SIZE:ROUNDS  rank 0 -> rank N-1, a window of 16 MPI_Isend per round and a 1-byte ack;
 *                          prints MB/s (1e6 B/s)
 *   allreduce:SIZE:ITERS   MPI_Allreduce(MPI_SUM) of SIZE bytes (int64) over all ranks, back to back;
 *                          prints µs per allreduce as rank 0 sees it
 * Every test warms up first (lazy connection setup of UCX and ob1 stays off the clock), then runs
 * its iterations in 5 rounds and prints the median round: a round that a descheduled rank spoiled
 * (8 ranks share 2 CPUs) does not set the figure. Output, rank 0 only:
 *   result pingpong 8 12.34
 * The data are not checked (tests/compat/mpi/mpi_check.c does that). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { rounds = 5, window = 16 };

static int rank, nranks;

static int cmp(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

static double median(double* v) {
  qsort(v, rounds, sizeof *v, cmp);
  return v[rounds / 2];
}

/* Seconds of one round of ITERS ping-pongs. */
static double pingpong_round(char* buf, int size, int iters) {
  int peer = nranks - 1;
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  for (int i = 0; i < iters; i++) {
    if (rank == 0) {
      MPI_Send(buf, size, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
      MPI_Recv(buf, size, MPI_BYTE, peer, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else if (rank == peer) {
      MPI_Recv(buf, size, MPI_BYTE, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      MPI_Send(buf, size, MPI_BYTE, 0, 2, MPI_COMM_WORLD);
    }
  }
  return MPI_Wtime() - t0;
}

/* Seconds of ITERS windows of 16 messages, each acknowledged. */
static double bandwidth_round(char* buf, int size, int iters) {
  int peer = nranks - 1;
  MPI_Request req[window];
  char ack = 0;
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  for (int i = 0; i < iters; i++) {
    if (rank == 0) {
      for (int w = 0; w < window; w++) MPI_Isend(buf + (size_t)w * size, size, MPI_BYTE, peer, 3, MPI_COMM_WORLD, &req[w]);
      MPI_Waitall(window, req, MPI_STATUSES_IGNORE);
      MPI_Recv(&ack, 1, MPI_CHAR, peer, 4, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else if (rank == peer) {
      for (int w = 0; w < window; w++) MPI_Irecv(buf + (size_t)w * size, size, MPI_BYTE, 0, 3, MPI_COMM_WORLD, &req[w]);
      MPI_Waitall(window, req, MPI_STATUSES_IGNORE);
      MPI_Send(&ack, 1, MPI_CHAR, 0, 4, MPI_COMM_WORLD);
    }
  }
  return MPI_Wtime() - t0;
}

static double allreduce_round(char* buf, int size, int iters) {
  int n = size / 8 > 0 ? size / 8 : 1;
  long long* out = (long long*)(buf + (size_t)window * size / 2);
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  for (int i = 0; i < iters; i++) MPI_Allreduce(buf, out, n, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  return MPI_Wtime() - t0;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  if (nranks < 2) {
    if (rank == 0) fprintf(stderr, "consumers_mpi: needs at least 2 ranks\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  for (int a = 1; a < argc; a++) {
    char name[32];
    int size = 0, iters = 0;
    if (sscanf(argv[a], "%31[a-z]:%d:%d", name, &size, &iters) != 3 || size < 1 || iters < rounds) {
      if (rank == 0) fprintf(stderr, "consumers_mpi: bad test '%s' (NAME:SIZE:ITERS, ITERS >= %d)\n", argv[a], rounds);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    double (*round)(char*, int, int) = NULL;
    if (!strcmp(name, "pingpong")) round = pingpong_round;
    else if (!strcmp(name, "bandwidth")) round = bandwidth_round;
    else if (!strcmp(name, "allreduce")) round = allreduce_round;
    else {
      if (rank == 0) fprintf(stderr, "consumers_mpi: unknown test '%s'\n", name);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    /* The window of 16 sends (bandwidth) or the input and output vectors (allreduce). */
    char* buf = calloc(window, (size_t)size);
    if (!buf) MPI_Abort(MPI_COMM_WORLD, 3);
    int per = iters / rounds;
    round(buf, size, per / 10 > 2 ? per / 10 : 2); /* warm-up */
    double t[rounds];
    for (int r = 0; r < rounds; r++) t[r] = round(buf, size, per);
    double m = median(t), v;
    if (round == pingpong_round) v = m / per / 2 * 1e6;
    else if (round == bandwidth_round) v = (double)size * window * per / m / 1e6;
    else v = m / per * 1e6;
    if (rank == 0) {
      printf("result %s %d %.3f\n", name, size, v);
      fflush(stdout);
    }
    free(buf);
  }
  MPI_Finalize();
  return 0;
}
