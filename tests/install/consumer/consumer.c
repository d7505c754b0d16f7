/* SPDX-License-Identifier: Apache-2.0 */
/* Built against an installed Chorus: one rank, one AllReduce, version checks. */
#include <chorus/chorus.h>
#include <nccl.h>
#include <stdio.h>

int main(void) {
  int version = 0;
  ncclComm_t comm;
  float x[4] = {1, 2, 3, 4};
  if (ncclGetVersion(&version) != ncclSuccess || version != NCCL_VERSION_CODE) return 1;
  if (ncclCommInitAll(&comm, 1, NULL) != ncclSuccess) return 2;
  if (ncclAllReduce(x, x, 4, ncclFloat, ncclSum, comm, NULL) != ncclSuccess) return 3;
  if (ncclCommDestroy(comm) != ncclSuccess) return 4;
  printf("consumer: %s, sum ok: %d\n", chorusBuildInfo(), x[3] == 4.0f);
  return x[3] == 4.0f ? 0 : 5;
}
