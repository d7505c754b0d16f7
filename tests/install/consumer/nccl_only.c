/* SPDX-License-Identifier: Apache-2.0 */
/* Built as against NCCL (-lnccl, <nccl.h> only), linked to the installed drop-in. */
#include <nccl.h>
#include <stdio.h>

int main(void) {
  ncclComm_t comms[2];
  double x[2][3] = {{0.25, 0.5, 1.5}, {0.125, 2.0, -0.75}};
  if (ncclCommInitAll(comms, 2, NULL) != ncclSuccess) return 1;
  /* Both ranks from one thread: NCCL's single-thread, many-communicator form, in a group. */
  if (ncclGroupStart() != ncclSuccess) return 2;
  for (int r = 0; r < 2; ++r)
    if (ncclAllReduce(x[r], x[r], 3, ncclDouble, ncclSum, comms[r], NULL) != ncclSuccess) return 3;
  if (ncclGroupEnd() != ncclSuccess) return 4;
  for (int r = 0; r < 2; ++r) ncclCommDestroy(comms[r]);
  int ok = x[0][0] == 0.375 && x[1][1] == 2.5 && x[0][2] == 0.75 && x[1][2] == 0.75;
  printf("nccl-only program on the drop-in: AllReduce %s\n", ok ? "right" : "WRONG");
  return ok ? 0 : 5;
}
