from exitwatch.cli import main

main()
