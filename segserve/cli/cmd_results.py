"""`segserve results query`: one table of the rows of many result folders."""


def add_parser(sub, common) -> None:
    p = sub.add_parser("results", help="`results query RESULTS...`: one table of the rows of many result folders")
    actions = p.add_subparsers(dest="action", required=True)
    q = actions.add_parser("query", help="filter, sort and cut the rows of result folders (each row with its suite and timestamp)")
    q.add_argument("results", nargs="+", metavar="RESULTS", help="result folders, or folders above them (results/)")
    q.add_argument("--where", action="append", default=[], metavar="COND", help="COLUMN OP VALUE, OP: < <= > >= = != (repeatable)")
    q.add_argument("--sort", metavar="COLUMN", help="sort by COLUMN, -COLUMN: descending")
    q.add_argument("--limit", type=int, help="at most this many rows")
    q.add_argument(
        "--pipelines", action="store_true", help="the rows of pipelines.jsonl (each pipeline's bounds and ratios), not of summary.jsonl"
    )
    q.add_argument("--format", choices=["table", "csv", "json"], default="table", help="table (default), csv or json")
    q.add_argument("--endpoint-url", help="s3:// RESULTS: the S3 endpoint (default: AWS's)")
    q.set_defaults(run=run)


def run(args) -> int:
    from segserve.bench.results.query import query, render

    rows, columns = query(args.results, args.where, args.sort, args.limit, args.endpoint_url, args.pipelines)
    print(render(rows, columns, args.format, args.where, args.sort, args.pipelines))
    return 0
