# Guarded: worker processes started with "spawn" (asynchronous scoring, DLRM preprocessing) import
# the parent's main module under another name, and must not run the command line again.
if __name__ == "__main__":
    try:
        from trainperf.cli import main
    except KeyboardInterrupt:  # Ctrl-C (or a launcher passing it on) while torch was being imported
        raise SystemExit(130) from None
    raise SystemExit(main())
