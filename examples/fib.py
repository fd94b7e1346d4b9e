def fibonacci(n):
    """Return the n-th Fibonacci number."""
    


def is_prime(n):
    """True when n is a prime number."""
    if n < 2:
        return False
    for d in range(2, int(n ** 0.5) + 1):
        if n % d == 0:
            return False
    return True


print(fibonacci(10), is_prime(7))
