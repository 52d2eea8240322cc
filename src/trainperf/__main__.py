from trainperf.cli import main

# Guarded: worker processes started with "spawn" (asynchronous scoring, DLRM preprocessing) import
# the parent's main module under another name, and must not run the command line again.
if __name__ == "__main__":
    raise SystemExit(main())
