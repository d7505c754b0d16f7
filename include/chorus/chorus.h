/* SPDX-License-Identifier: Apache-2.0
 * File: include/chorus/chorus.h
 * Chorus's own API beside nccl.h: version and the extension headers. Everything here is
 * prefixed chorus; nothing Chorus adds uses the nccl prefix.
 */
#ifndef CHORUS_CHORUS_H_
#define CHORUS_CHORUS_H_

#include <nccl.h>
#include <chorus/stream.h>

#define CHORUS_MAJOR 0
#define CHORUS_MINOR 1
#define CHORUS_PATCH 0
#define CHORUS_VERSION_CODE (CHORUS_MAJOR * 10000 + CHORUS_MINOR * 100 + CHORUS_PATCH)

#ifdef __cplusplus
extern "C" {
#endif

/* Stores CHORUS_VERSION_CODE of the library (not of the header). */
ncclResult_t chorusGetVersion(int* version);

/* A static string describing the library build: version, git revision, kernels, transports. */
const char* chorusBuildInfo(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* CHORUS_CHORUS_H_ */
