"""The reference of `ckpt-bench io --shared-uri s3://...`: boto3's own transfers
of the same file to and from the same server, with TransferManager's defaults
(boto3.s3.transfer.TransferConfig()), timed in this process (the interpreter's
start and boto3's import are not counted).

    bench_boto3.py ENDPOINT BUCKET KEY FILE RUNS
    (credentials from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)

Prints one JSON object: the seconds of each upload_file and of each
download_fileobj into memory (io.BytesIO, as a restore lands in a rank's
memory), and the CPU seconds (every thread's) of each upload.
"""

import io
import json
import sys
import time

import boto3
import botocore.config


def main():
    endpoint, bucket, key, path, runs = sys.argv[1:6]
    s3 = boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1",
        config=botocore.config.Config(s3={"addressing_style": "path"}))
    up, up_cpu, down = [], [], []
    for _ in range(int(runs)):
        start, cpu = time.perf_counter(), time.process_time()
        s3.upload_file(path, bucket, key)
        up.append(time.perf_counter() - start)
        up_cpu.append(time.process_time() - cpu)
        sink = io.BytesIO()
        start = time.perf_counter()
        s3.download_fileobj(bucket, key, sink)
        down.append(time.perf_counter() - start)
        if sink.tell() == 0:
            raise SystemExit("bench_boto3: nothing downloaded")
    print(json.dumps({"upload_s": up, "upload_cpu_s": up_cpu,
                      "download_s": down}))


if __name__ == "__main__":
    main()
