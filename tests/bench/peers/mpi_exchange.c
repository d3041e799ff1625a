/* The exchange consensusd's rounds do, written with MPI point-to-point: each
 * round every rank sends its float32 vector to each neighbour, receives
 * theirs, and replaces its vector by the average of its own and theirs.
 * scripts/bench-rounds --peers runs it beside consensusd on the same graph.
 *
 *   mpirun -np P mpi_exchange BYTES ROUNDS WARMUP NEIGHBOURS_FILE
 *
 * NEIGHBOURS_FILE: line i lists rank i's neighbours. Prints, on rank 0, the
 * mean round time after WARMUP rounds in ms, the maximum over ranks. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEGREE 64

static int read_neighbours(const char* path, int rank, int* out) {
  FILE* f = fopen(path, "r");
  if (!f) return -1;
  char line[4096];
  int count = -1;
  for (int i = 0; i <= rank && fgets(line, sizeof line, f); ++i) {
    if (i < rank) continue;
    count = 0;
    for (char* token = strtok(line, " \n"); token && count < MAX_DEGREE;
         token = strtok(NULL, " \n"))
      out[count++] = atoi(token);
  }
  fclose(f);
  return count;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (argc != 5) {
    if (rank == 0) fprintf(stderr, "usage: mpi_exchange BYTES ROUNDS WARMUP NEIGHBOURS_FILE\n");
    MPI_Abort(MPI_COMM_WORLD, 64);
  }
  const long n = atol(argv[1]) / (long)sizeof(float);
  const int rounds = atoi(argv[2]), warmup = atoi(argv[3]);
  int neighbours[MAX_DEGREE];
  const int degree = read_neighbours(argv[4], rank, neighbours);
  if (degree < 0) MPI_Abort(MPI_COMM_WORLD, 66);

  float* x = malloc(n * sizeof(float));
  float* in = malloc((size_t)degree * n * sizeof(float));
  MPI_Request requests[2 * MAX_DEGREE];
  for (long k = 0; k < n; ++k) x[k] = (float)rank;
  memset(in, 0, (size_t)degree * n * sizeof(float)); /* pages touched once, as reused buffers are */

  double start = 0;
  for (int r = 0; r < warmup + rounds; ++r) {
    if (r == warmup) {
      MPI_Barrier(MPI_COMM_WORLD);
      start = MPI_Wtime();
    }
    for (int j = 0; j < degree; ++j) {
      MPI_Irecv(in + j * n, (int)n, MPI_FLOAT, neighbours[j], 0, MPI_COMM_WORLD, &requests[j]);
      MPI_Isend(x, (int)n, MPI_FLOAT, neighbours[j], 0, MPI_COMM_WORLD, &requests[degree + j]);
    }
    MPI_Waitall(2 * degree, requests, MPI_STATUSES_IGNORE);
    const float share = 1.0f / (float)(degree + 1);
    for (long k = 0; k < n; ++k) {
      float sum = x[k];
      for (int j = 0; j < degree; ++j) sum += in[j * n + k];
      x[k] = sum * share;
    }
  }
  const double mean = (MPI_Wtime() - start) / rounds;
  double worst = 0;
  MPI_Reduce(&mean, &worst, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  if (rank == 0) printf("%.4f\n", worst * 1e3);
  free(x);
  free(in);
  MPI_Finalize();
  return 0;
}
