class Vector3:
    """A 3D vector."""

    def __init__(self, x, y, z):
        self.x = x
        self.y = y
        self.z = z

    def __mul__(self, k):
        return Vector3(self.x * k, self.y * k, self.z * k)

    def __truediv__(self, k):
        return Vector3(self.x / k, self.y / k, self.z / k)

    def __neg__(self):
        return Vector3(-self.x, -self.y, -self.z)

    def __repr__(self):
        return f"Vector3({self.x}, {self.y}, {self.z})"
